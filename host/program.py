"""`python -m onnxpool.host.program ...`: how supervisord starts each program of a host, and its janitor.

supervisord forks each program in a process group of its own (it calls setpgrp) and then execs
its command: this module, which prepares the process and execs the program's real command
(gunicorn for a model's pool and for the host's routes, nginx for the front door). Standard
library only: it runs at every (re)start, before the program's own start-up.

Process rules, in the order they run:
1. Leftovers of this program's previous run are stopped first. A pool master killed with
   SIGKILL leaves its workers (they notice only after gunicorn's timeout / 2): their process
   group, recorded in the program's group file, is sent `--leftover-signal` (TERM: they finish
   what they hold) and waited for, then SIGKILL, so a restarted pool never shares its socket
   with a ghost. An nginx master killed leaves its workers, which never notice and keep serving
   the port: with `--hand-over` they are recorded instead (`<program>.leftover`), and the host
   stops them gracefully once the new nginx, bound beside them (`reuseport`), answers. So the
   front door never refuses a connection while it restarts, and nothing is left behind.
2. This process's group (its own pid) is recorded in the group file.
3. It joins its model's cgroup (`--cgroup`) before exec: gunicorn's workers, its preflight and
   every replacement worker are forked from it, so they are all in the model's cgroup and weigh
   its budget.
4. Its output goes straight to the host's (`--output-socket`): the host hands this process its own
   stdout and stderr over a unix socket (SCM_RIGHTS), so a pool's log lines (one per request
   with the access log) are written by the pool itself, as a one-model server's are, and not
   read and written again by supervisord (measured: 7 % of a core at 650 requests/s). Where the
   host cannot be asked, the output stays supervisord's pipe (supervisord passes it on).
5. The parent-death signal is set (`--deathsig`): if supervisord dies (SIGKILL), the kernel sends
   it to this process, so a pool stops gracefully and nginx finishes what it holds; nothing runs
   on without its supervisor. It survives exec (unless set-uid), and is not inherited by forks.

`janitor` is a process of the host's own, beside supervisord (not one of its programs): it waits
for supervisord to exit (a pidfd: woken by the exit, no polling), then for every recorded program
group to be gone (bounded by the host's current `graceful_timeout`, read from host.json then),
and removes the models' cgroups and the host's run folder. Nothing a reload does stops
supervisord, so no reload can set it off; and a host killed with SIGKILL (its supervisord then
gets SIGTERM by its parent-death signal and stops every program) still leaves no process, cgroup
or folder behind. It ignores the stop signals that reach the whole unit or terminal (systemd's
KillMode, Ctrl-C): its one trigger is supervisord's exit.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1
LEFTOVER_SECONDS = 10.0
"""How long a program's start waits for its previous run's processes after `--leftover-signal`."""
POLL_SECONDS = 0.05
OUTPUT_SECONDS = 2.0
"""How long a program waits for the host to hand it its output."""


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid` in this process's session, from /proc.

    The session check keeps a recorded group whose number the kernel gave to someone else since
    (pid reuse) out of reach: every program of a host is in the host's session (supervisord makes
    process groups, not sessions)."""
    session = os.getsid(0)
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            if int(fields[2]) == pgid and int(fields[3]) == session and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def read_group(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def write_group(path: Path, pgid: int) -> None:
    """Record a process group (written beside, then renamed: a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(f"{pgid}\n")
    os.replace(partial, path)


def leftover_file(group_file: Path) -> Path:
    """Where a program that hands over records its previous run's group (`--hand-over`)."""
    return group_file.with_suffix(".leftover")


def signal_group(pgid: int, sig: int) -> int:
    """Send `sig` to the group's members in this session; how many there were."""
    members = group_members(pgid)
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return len(members)


def stop_group(pgid: int, sig: int, seconds: float) -> list[int]:
    """Send `sig` to the group, wait up to `seconds` for it to empty, then SIGKILL what is left.
    Returns the pids that had to be killed."""
    own = os.getpgrp()
    if pgid <= 1 or pgid == own or not group_members(pgid):
        return []
    signal_group(pgid, sig)  # by pid, not killpg: only the members in this session
    deadline = time.monotonic() + seconds
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    killed = group_members(pgid)
    for pid in killed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        while group_members(pgid) and time.monotonic() < deadline + seconds:
            time.sleep(POLL_SECONDS)
    return killed


def share_output(path: Path) -> threading.Thread:
    """Host: hand this process's stdout and stderr to every program that asks on `path` (owner only)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o600)
    server.listen(16)

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection, contextlib.suppress(OSError):
                socket.send_fds(connection, [b"out"], [1, 2])

    thread = threading.Thread(target=serve, name="share-output", daemon=True)
    thread.start()
    return thread


def take_output(path: Path) -> bool:
    """Program: make the host's stdout and stderr this process's (False: keep supervisord's pipe)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(OUTPUT_SECONDS)
            client.connect(str(path))
            _message, fds, _flags, _address = socket.recv_fds(client, 16, 2)
    except OSError:
        return False
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, target in zip(fds, (1, 2), strict=True):
        os.dup2(fd, target)
        os.close(fd)
    return True


def set_parent_death_signal(sig: int) -> None:
    """prctl(PR_SET_PDEATHSIG): the kernel sends `sig` to this process when its parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _signal(name: str) -> int:
    return int(getattr(signal, f"SIG{name.upper().removeprefix('SIG')}"))


def run(args: argparse.Namespace) -> None:
    """Prepare this process (module doc, steps 1-4) and exec the program's command."""
    parent = os.getppid()
    group_file = Path(args.group_file)
    previous = read_group(group_file)
    if previous is not None and group_members(previous):
        if args.hand_over:
            # nginx: its orphaned workers keep serving on the port until the new nginx (bound beside
            # them, `reuseport`) answers; the host then stops them gracefully (host/controller.py).
            write_group(leftover_file(group_file), previous)
        else:
            killed = stop_group(previous, _signal(args.leftover_signal), LEFTOVER_SECONDS)
            if killed:
                print(f"onnxpool.host: {group_file.stem}: killed {len(killed)} leftover processes", file=sys.stderr)
    write_group(group_file, os.getpgrp())
    if args.cgroup:
        (Path(args.cgroup) / "cgroup.procs").write_text(f"{os.getpid()}\n")
    if args.output_socket:
        take_output(Path(args.output_socket))
    set_parent_death_signal(_signal(args.deathsig))
    if os.getppid() != parent:  # supervisord died before the signal was set: it will never be sent
        raise SystemExit(1)
    os.execvp(args.command[0], args.command)


def janitor(args: argparse.Namespace) -> None:
    """Wait for supervisord to exit (module doc), then clean up after every program of the host."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)  # its one trigger is supervisord's exit
    run_dir = Path(args.run_dir)
    wait_for_exit(args.supervisord)
    clean_up(run_dir, Path(args.cgroup) if args.cgroup else None, _grace(run_dir, args.wait))


def wait_for_exit(pid: int) -> None:
    """Block until process `pid` (not a child) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [])  # readable once the process has exited
    finally:
        os.close(fd)


def _grace(run_dir: Path, default: float) -> float:
    """How long the programs may take to stop: the host's graceful_timeout as of its last reload, + 10 s."""
    try:
        return float(json.loads((run_dir / "host.json").read_text(encoding="utf-8"))["graceful_timeout"]) + 10
    except (OSError, ValueError, KeyError, TypeError):
        return default


def clean_up(run_dir: Path, cgroup: Path | None, wait: float) -> None:
    """Once every program's group is gone (or killed after `wait` s): remove the cgroups and the folder."""
    own = os.getpgrp()
    records = [*(run_dir / "programs").glob("*.pgid"), *(run_dir / "programs").glob("*.leftover")]
    groups = [read_group(path) for path in sorted(records)]
    deadline = time.monotonic() + wait
    for pgid in groups:
        if pgid is None or pgid == own:
            continue
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        stop_group(pgid, signal.SIGKILL, 2.0)
    if cgroup is not None:
        remove_cgroup_tree(cgroup, deadline)
    shutil.rmtree(run_dir, ignore_errors=True)


def remove_cgroup_tree(folder: Path, deadline: float) -> None:
    """rmdir the host's cgroup and its children (a cgroup folder goes once its processes have left).

    The host and its janitor may both clean up at once (a SIGTERM while the models start): a folder the
    other one removed between two steps is already done, not an error."""
    try:
        children = sorted((path for path in folder.iterdir() if path.is_dir()), reverse=True)
    except (FileNotFoundError, NotADirectoryError):
        return
    for child in children:
        remove_cgroup_tree(child, deadline)
    while True:
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(POLL_SECONDS)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m onnxpool.host.program")
    sub = parser.add_subparsers(dest="mode", required=True)
    exec_ = sub.add_parser("exec", help="prepare this process and exec COMMAND (supervisord's programs)")
    exec_.add_argument("--group-file", required=True, help="where this program's process group is recorded")
    exec_.add_argument("--cgroup", default="", help="the model's cgroup folder to join before exec")
    exec_.add_argument("--deathsig", default="TERM", help="signal sent to this program when supervisord dies")
    exec_.add_argument("--leftover-signal", default="TERM", help="signal for the previous run's processes")
    exec_.add_argument("--output-socket", default="", help="where the host hands out its stdout and stderr")
    exec_.add_argument(
        "--hand-over", action="store_true", help="leave the previous run's processes to the host (nginx)"
    )
    exec_.add_argument("command", nargs="+")
    janitor_ = sub.add_parser("janitor", help="remove the host's cgroups and run folder once supervisord exited")
    janitor_.add_argument("--run-dir", required=True)
    janitor_.add_argument("--cgroup", default="")
    janitor_.add_argument("--supervisord", type=int, required=True, help="the pid whose exit starts the clean-up")
    janitor_.add_argument("--wait", type=float, default=40.0, help="seconds to wait for the programs (no host.json)")
    args = parser.parse_args(argv)
    if args.mode == "exec":
        run(args)
    else:
        janitor(args)


if __name__ == "__main__":
    main()
