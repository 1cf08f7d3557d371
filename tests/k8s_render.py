"""Helpers for the container/Kubernetes checks: find the CI tools, render a
Kustomize directory with `kubectl kustomize`, and pick objects out of it.

A missing tool fails the test when CI=true (CI must install it; a skip there
would hide a check that never ran) and skips it on a developer's machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
K8S = REPO / "deploy" / "k8s"
OVERLAYS = K8S / "overlays"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "k8s"
# Deployable overlays (each one a complete application: one Deployment of the two-container
# pod); `zoo` (several models in one single-container pod) and `scale-out` (one Deployment per
# model behind one Ingress) have checks of their own; `kserve` is an optional ServingRuntime,
# rendered and validated but not a Deployment.
APP_OVERLAYS = ("pinned", "shared", "monitoring", "ingress-nginx")
SEVERAL_MODEL_OVERLAYS = ("zoo", "scale-out")
ALL_OVERLAYS = (*APP_OVERLAYS, *SEVERAL_MODEL_OVERLAYS, "kserve")
# kubernetes-validate bundles schemas for 1.25 .. 1.37; we support all of them.
K8S_VERSIONS = ("1.25.0", "1.37.0")
# Custom resources kubernetes-validate has no schema for, checked by hand.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("serving.kserve.io/v1alpha1", "ServingRuntime"),
}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need_tool(name: str) -> str:
    """Path of a command-line tool: next to this Python (venv) first, then PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which(name)
    if found:
        return found
    message = f"{name} not found (next to {sys.executable} or on PATH)"
    if in_ci():
        pytest.fail(f"{message}: CI must install it (see deploy/container/README.md)")
    pytest.skip(message)


def render(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR`, parsed: one dict per object."""
    kubectl = need_tool("kubectl")
    proc = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        raise RenderError(f"kubectl kustomize {directory} failed:\n{proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


class RenderError(Exception):
    pass


def objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = objects(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(deployment: dict[str, Any], name: str = "onnxpool") -> dict[str, Any]:
    for c in deployment["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return dict(c)
    raise AssertionError(f"no container {name!r} in Deployment {deployment['metadata']['name']}")


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def cpu_quantity(value: str | int | float) -> float:
    """Kubernetes CPU quantity ("1500m", "2", 0.5) in CPUs."""
    text = str(value)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def bytes_quantity(value: str | int) -> int:
    """Kubernetes memory quantity ("640Mi", "1G", "1048576") in bytes."""
    text = str(value)
    for suffix, factor in (*_BINARY.items(), *_DECIMAL.items()):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)
