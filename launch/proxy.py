"""`onnxpool nginx`: run nginx in the foreground in front of this onnxpool (the pod's second container).

The configuration is written from onnxpool's own settings: the site is the one
`onnxpool nginx-config` writes for VMs, inside a main configuration whose pid file,
temp folders and the rendered files all sit beside `[nginx] pidfile` (a writable
volume; the root stays read-only).

Process rules (why this is a wrapper and not an exec):
- A container runtime stops a container with SIGTERM, which is nginx's FAST
  shutdown (connections cut). This process stays as the container's pid 1 and
  turns SIGTERM into SIGQUIT, nginx's graceful one: stop accepting, finish every
  request in flight (including bodies still arriving), then exit. SIGINT stays a
  fast stop; HUP first writes the files again from the settings file read anew
  (a changed caller or quota; a file that does not load is refused and nginx
  keeps its files), then is passed on; USR1 (reopen logs) and QUIT are passed on.
- nginx deletes its pid file when its master exits; the onnxpool master in the
  same pod waits for that on its own SIGTERM (launch/drain.py), so gunicorn keeps
  serving until nginx has nothing left to send it.
- Exit status is nginx's (128 + signal number if a signal killed it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING

from onnxpool.config.callers import caller_book_of
from onnxpool.config.loader import ConfigError
from onnxpool.config.nginx import render_callers_script, render_main, render_site
from onnxpool.config.nginx_callers import CALLERS_SCRIPT, needs_js
from onnxpool.config.settings import Settings

if TYPE_CHECKING:
    from onnxpool.config.callers import CallerBook

# What the runtime sends -> what nginx gets.
FORWARD = {
    signal.SIGTERM: signal.SIGQUIT,  # graceful: the reason this wrapper exists
    signal.SIGQUIT: signal.SIGQUIT,
    signal.SIGINT: signal.SIGTERM,  # Ctrl-C: nginx's fast stop
    signal.SIGHUP: signal.SIGHUP,
    signal.SIGUSR1: signal.SIGUSR1,
}
SITE_FILE = "onnxpool-site.conf"
MAIN_FILE = "nginx.conf"
TEMP_FOLDERS = ("body", "proxy", "fastcgi", "uwsgi", "scgi")


def nginx_binary() -> str | None:
    """nginx from PATH, or Debian's /usr/sbin (often not on a non-root user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


JS_MODULE = "ngx_http_js_module.so"
"""nginx's JavaScript module (Debian: libnginx-mod-http-js): routes by a body's `model`, names callers by key."""


class NginxFilesError(Exception):
    """nginx's files cannot be written as asked: one line for the operator."""


def js_module(binary: str) -> Path | None:
    """nginx's js module file, in the modules folder `nginx -V` names (else Debian's, /usr/lib/nginx/modules)."""
    try:
        text = subprocess.run([binary, "-V"], capture_output=True, text=True, check=False).stderr
    except OSError:
        return None
    found = re.search(r"--modules-path=(\S+)", text)
    folder = Path(found.group(1)) if found else Path("/usr/lib/nginx/modules")
    return folder / JS_MODULE if (folder / JS_MODULE).is_file() else None


def required_js_module(binary: str, why: str, error: type[Exception] = NginxFilesError) -> Path:
    """The js module, or `error` saying `why` it is needed and how to install it."""
    module = js_module(binary)
    if module is None:
        raise error(f"{why} with its js module, which is not installed (Debian: apt-get install libnginx-mod-http-js)")
    return module


def write_callers_script(folder: Path, callers: CallerBook) -> Path | None:
    """callers.js in `folder` when nginx names callers by key (config/nginx_callers.py); its path, else None."""
    if not needs_js(callers):
        return None
    script = folder / CALLERS_SCRIPT
    script.write_text(render_callers_script(callers), encoding="utf-8")
    return script


def write_config(settings: Settings, binary: str) -> Path:
    """Render site + main configuration beside [nginx] pidfile; returns the main file's path.
    Raises ConfigError (the keys file) or NginxFilesError (callers by key without nginx's js module)."""
    prefix = Path(settings.nginx.pidfile).parent
    for folder in TEMP_FOLDERS:
        (prefix / "tmp" / folder).mkdir(parents=True, exist_ok=True)
    callers = caller_book_of(settings)
    script = write_callers_script(prefix, callers)
    modules = [required_js_module(binary, "callers are named by their keys")] if script is not None else []
    site = prefix / SITE_FILE
    site.write_text(render_site(settings, callers=callers, script=str(script or "")), encoding="utf-8")
    main = prefix / MAIN_FILE
    main.write_text(render_main(settings, site, modules), encoding="utf-8")
    return main


def run_nginx(settings: Settings, binary: str, reread: Callable[[], Settings] | None = None) -> int:
    """Start nginx on the written configuration, forward signals, return its exit status. On HUP the
    settings are read again (`reread`) and the files written anew first: a changed caller or quota."""
    try:
        main = write_config(settings, binary)
    except (ConfigError, NginxFilesError) as exc:
        print(f"onnxpool: error: {exc}", file=sys.stderr)
        return 1
    prefix = main.parent
    argv = [binary, "-p", str(prefix), "-c", str(main), "-e", "stderr"]
    check = subprocess.run([*argv, "-t", "-q"], check=False, capture_output=True)
    if check.returncode != 0:
        sys.stderr.buffer.write(check.stderr)
        print(f"onnxpool: error: nginx refused the configuration in {main}", file=sys.stderr)
        return 1
    # nginx's stdout is a pipe of ours, copied to our stdout: an access log at /dev/stdout is
    # re-opened by nginx through /proc/self/fd/1, which a non-root nginx may not do when that
    # is a file or fifo owned by root (the runtime's); a pipe made by this process is its own.
    child = subprocess.Popen(argv, stdout=subprocess.PIPE)
    copier = threading.Thread(target=copy_lines, args=(child.stdout, sys.stdout.buffer), daemon=True)
    copier.start()

    def forward(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP and reread is not None:
            try:
                write_config(reread(), binary)
            except (ConfigError, NginxFilesError, OSError) as exc:
                print(f"onnxpool: error: reload: nginx keeps its files: {exc}", file=sys.stderr, flush=True)
                return
        if child.poll() is None:
            os.kill(child.pid, FORWARD[signal.Signals(signum)])

    for signum in FORWARD:
        signal.signal(signum, forward)
    returncode = child.wait()
    copier.join(5)
    return returncode if returncode >= 0 else 128 - returncode


def copy_lines(source: IO[bytes] | None, target: IO[bytes]) -> None:
    """Lines from nginx's stdout pipe to ours, until nginx and its workers have closed it."""
    if source is None:
        return
    for line in iter(source.readline, b""):
        target.write(line)
        target.flush()
