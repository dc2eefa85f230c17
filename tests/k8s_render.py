"""The Kubernetes manifests for the tests: the Helm chart rendered by the real ``helm`` binary.

helm is built from source with Go into ``.cache/go-bin`` by ``deploy/helm/ensure-helm.sh`` (``make
helm-tools``), once; :func:`helm` builds it on first use and skips the calling test, with the
reason, only when it cannot be built."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

Manifest = dict[str, Any]

REPO = Path(__file__).resolve().parents[1]
HELM_DIR = REPO / "deploy" / "helm"
CHART = HELM_DIR / "transaction-webhook-bridge"
PRODUCTION_VALUES = HELM_DIR / "values-production.example.yaml"
ENSURE_HELM = HELM_DIR / "ensure-helm.sh"
HELM = REPO / ".cache" / "go-bin" / "helm"
RELEASE = "transaction-webhook-bridge"
# Building helm compiles for a few minutes on a fresh machine.
BUILD_TIMEOUT_SECONDS = 1200


@functools.cache
def _build_helm() -> str | None:
    """None when helm is ready, else why it could not be built."""
    try:
        result = subprocess.run(
            ["sh", str(ENSURE_HELM)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"helm could not be built ({exc})"
    if result.returncode != 0 or not HELM.is_file():
        return f"helm could not be built (`make helm-tools`): {result.stderr.strip()[-500:]}"
    return None


@functools.cache
def _helm_home() -> str:
    return tempfile.mkdtemp(prefix="helm-home-")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the real helm (built on first use), with its caches and config in a temporary home."""
    problem = _build_helm()
    if problem:
        pytest.skip(problem)
    home = _helm_home()
    environ = {
        **os.environ,
        "HELM_CACHE_HOME": f"{home}/cache",
        "HELM_CONFIG_HOME": f"{home}/config",
        "HELM_DATA_HOME": f"{home}/data",
    }
    result = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, env=environ, timeout=120, cwd=REPO
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render(
    *values_files: Path,
    set_values: dict[str, str] | None = None,
    namespace: str = "default",
    kube_version: str | None = None,
) -> list[Manifest]:
    """``helm template`` of the chart with these values files and ``--set`` values."""
    return parse(
        render_text(
            *values_files, set_values=set_values, namespace=namespace, kube_version=kube_version
        )
    )


def render_text(
    *values_files: Path,
    set_values: dict[str, str] | None = None,
    namespace: str = "default",
    kube_version: str | None = None,
    check: bool = True,
) -> str:
    args = ["template", RELEASE, str(CHART), "--namespace", namespace]
    for path in values_files:
        args += ["--values", str(path)]
    for key, value in (set_values or {}).items():
        args += ["--set", f"{key}={value}"]
    if kube_version:
        args += ["--kube-version", kube_version]
    result = helm(*args, check=check)
    if not check and result.returncode != 0:
        raise RenderError(result.stderr)
    return result.stdout


class RenderError(Exception):
    """helm refused to render (the message is helm's)."""


def parse(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def load_documents(path: Path) -> list[Manifest]:
    """The non-empty YAML documents of a file."""
    return parse(path.read_text())


def find(manifests: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    """The manifests of a kind (and name, if given)."""
    return [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]


def one(manifests: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    """The single manifest of a kind (and name); fails when there is none or several."""
    found = find(manifests, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def containers(manifests: list[Manifest]) -> list[dict[str, Any]]:
    """Every container and init container of every pod template."""
    found: list[dict[str, Any]] = []
    for manifest in manifests:
        pod = manifest.get("spec", {}).get("template", {}).get("spec", {})
        found += pod.get("containers", []) + pod.get("initContainers", [])
    return found
