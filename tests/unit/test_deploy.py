"""The deployment files: the Dockerfile and the Helm chart (rendered by the real helm), checked
against each other and against the bridge itself (its CLI, its health routes, its configuration).
The chart's own checks (helm lint, the Kubernetes OpenAPI schemas, the NetworkPolicy, the values)
are in test_helm.py."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from bridge.config.loader import load_config
from bridge.core.settings import Config
from bridge.ops.health import health_app
from tests.k8s_render import (
    BUILD_TIMEOUT_SECONDS,
    CHART,
    HELM_DIR,
    PRODUCTION_VALUES,
    Manifest,
    containers,
    find,
    load_documents,
    one,
    render,
)

REPO = Path(__file__).resolve().parents[2]
# The first test may build helm (a few minutes, once): see tests/k8s_render.py.
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_SECONDS + 120)
# The chart's values files of each rendering: the defaults, and the production example.
VALUES = {"default": (), "production": (PRODUCTION_VALUES,)}
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
SECRET_EXAMPLE = HELM_DIR / "secret.example.yaml"
# Where the image and the pod put things: the test rewrites these in a copy of the ConfigMap's
# bridge.yaml, since neither path exists on the machine running the tests.
SECRETS_DIR = "/var/run/secrets/bridge"
IMAGE_SCHEMAS_DIR = "/opt/bridge/schemas"
# App.run flushes the producer for up to this long after draining, before the process exits.
PRODUCER_CLOSE_SECONDS = 10.0


@dataclass
class Rendered:
    """One rendering of the chart and the bridge configuration its ConfigMap carries."""

    manifests: list[Manifest]
    values: dict[str, Any]  # the chart's values.yaml merged with the values files (top level)
    config_text: str
    local_config: Path  # a copy with secret and schema paths rewritten to files that exist here
    config: Config

    def deployment(self) -> Manifest:
        return one(self.manifests, "Deployment")

    def pod(self) -> dict[str, Any]:
        pod: dict[str, Any] = self.deployment()["spec"]["template"]["spec"]
        return pod

    def container(self) -> dict[str, Any]:
        (container,) = self.pod()["containers"]
        result: dict[str, Any] = container
        return result

    def mount(self, volume_kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The volume of a kind (configMap, secret) and the container's mount of it."""
        (volume,) = [v for v in self.pod()["volumes"] if volume_kind in v]
        (mount,) = [m for m in self.container()["volumeMounts"] if m["name"] == volume["name"]]
        return volume, mount


def localize(config_text: str, workdir: Path) -> Path:
    """Write a copy of a pod's bridge.yaml that works here: secrets from the example Secret's
    placeholders in ``workdir``, schemas from the repository (what the Dockerfile copies)."""
    assert SECRETS_DIR in config_text and IMAGE_SCHEMAS_DIR in config_text
    secrets = workdir / "secrets"
    secrets.mkdir(parents=True, exist_ok=True)
    for key, value in secret_example()["stringData"].items():
        (secrets / key).write_text(value + "\n")
    text = config_text.replace(SECRETS_DIR, str(secrets))
    text = text.replace(IMAGE_SCHEMAS_DIR, str(REPO / "schemas"))
    path = workdir / "bridge.yaml"
    path.write_text(text)
    return path


def secret_example() -> Manifest:
    """The template Secret of the webhook secrets (placeholders only)."""
    (secret,) = load_documents(SECRET_EXAMPLE)
    return secret


def top_level_values(*values_files: Path) -> dict[str, Any]:
    """The chart's values with the files' top-level keys laid over (enough for replicaCount)."""
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in values_files:
        values.update(yaml.safe_load(path.read_text()))
    return values


@pytest.fixture(scope="module", params=sorted(VALUES))
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """The chart rendered with each values set (defaults, production), with its configuration."""
    manifests = render(*VALUES[request.param])
    values = top_level_values(*VALUES[request.param])
    (config_map,) = [m for m in find(manifests, "ConfigMap") if "bridge.yaml" in m.get("data", {})]
    config_text = config_map["data"]["bridge.yaml"]
    local = localize(config_text, tmp_path_factory.mktemp(request.param))
    return Rendered(manifests, values, config_text, local, load_config(local, environ={}))


def labels_select(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector selects objects carrying ``labels``."""
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are checked here"
    match_labels: dict[str, str] = selector["matchLabels"]
    return bool(match_labels) and match_labels.items() <= labels.items()


# ---- schemas of built-in kinds, required fields of custom resources ------------------------------


def test_service_monitor_has_what_prometheus_operator_requires(rendered: Rendered) -> None:
    if not rendered.values["serviceMonitor"]["enabled"]:  # off by default: then none at all
        assert not find(rendered.manifests, "ServiceMonitor")
        return
    monitor = one(rendered.manifests, "ServiceMonitor")
    service = one(rendered.manifests, "Service")
    spec = monitor["spec"]
    assert labels_select(spec["selector"], service["metadata"]["labels"])
    assert spec["endpoints"], "spec.endpoints must not be empty"
    routes = health_routes()
    service_ports = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in spec["endpoints"]:
        assert endpoint["port"] in service_ports
        assert endpoint.get("path", "/metrics") in routes
        interval, timeout = (seconds(endpoint[key]) for key in ("interval", "scrapeTimeout"))
        assert 0 < timeout <= interval


def test_scaled_object_has_what_keda_requires_and_matches_the_bridge(rendered: Rendered) -> None:
    if not rendered.values["keda"]["enabled"]:  # off by default: then none at all
        assert not find(rendered.manifests, "ScaledObject")
        return
    scaled = one(rendered.manifests, "ScaledObject")
    spec = scaled["spec"]
    config = rendered.config
    target = spec["scaleTargetRef"]
    assert (target.get("kind", "Deployment"), target["name"]) == (
        "Deployment",
        rendered.deployment()["metadata"]["name"],
    )
    (trigger,) = spec["triggers"]
    metadata = trigger["metadata"]
    assert trigger["type"] == "kafka"
    assert all(isinstance(value, str) and value for value in metadata.values()), (
        "trigger metadata is a map of non-empty strings"
    )
    (source,) = rendered.container()["envFrom"]
    kafka_env = one(rendered.manifests, "ConfigMap", source["configMapRef"]["name"])["data"]
    assert metadata["bootstrapServers"] == kafka_env["KAFKA_BOOTSTRAP_SERVERS"]
    assert metadata["consumerGroup"] == config.kafka.group_id
    assert metadata["topic"] == config.topics.source
    assert int(metadata["lagThreshold"]) > 0
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= config.topics.partitions
    assert spec["minReplicaCount"] == rendered.values["replicaCount"]
    # The autoscaler owns the count: an upgrade must not reset it.
    assert "replicas" not in rendered.deployment()["spec"]


# ---- the Deployment against the bridge ---------------------------------------------------------


def test_configmap_bridge_yaml_passes_bridge_check_offline(rendered: Rendered) -> None:
    """The real CLI on the ConfigMap's file (secret and schema paths rewritten, see localize)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "check", "--offline", "--config", rendered.local_config],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environ,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"valid; {len(rendered.config.webhooks)} webhook(s)" in result.stdout
    assert rendered.config.webhooks, "the example configuration should show webhooks"


def test_probes_and_ports_match_the_health_routes_and_config(rendered: Rendered) -> None:
    container = rendered.container()
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["metrics"] == rendered.config.metrics.port == 9464
    assert rendered.config.metrics.host == "0.0.0.0"
    routes = health_routes()
    liveness, readiness = container["livenessProbe"], container["readinessProbe"]
    assert liveness["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert readiness["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert {"/healthz", "/readyz", "/metrics"} <= routes
    (service_port,) = one(rendered.manifests, "Service")["spec"]["ports"]
    assert (service_port["name"], service_port["targetPort"]) == ("metrics", "metrics")


def test_termination_grace_outlasts_the_bridge_shutdown(rendered: Rendered) -> None:
    grace = rendered.pod()["terminationGracePeriodSeconds"]
    assert grace > rendered.config.delivery.shutdown_grace_seconds + PRODUCER_CLOSE_SECONDS


def test_rolling_update_never_drops_below_capacity(rendered: Rendered) -> None:
    strategy = rendered.deployment()["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    budget = one(rendered.manifests, "PodDisruptionBudget")["spec"]
    assert budget.get("maxUnavailable") == 1 or budget.get("minAvailable") == 1
    assert labels_select(
        budget["selector"], rendered.deployment()["spec"]["template"]["metadata"]["labels"]
    )


def test_pod_is_non_root_read_only_and_resource_bounded(rendered: Rendered) -> None:
    pod, container = rendered.pod(), rendered.container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == dockerfile_user_id()
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False
    resources = container["resources"]
    assert resources["requests"] == {"cpu": "250m", "memory": "128Mi"}
    assert resources["limits"] == {"memory": "256Mi"}  # above the < 200 MB RSS target


def test_config_and_secrets_are_mounted_where_the_config_names_them(rendered: Rendered) -> None:
    container = rendered.container()
    config_volume, config_mount = rendered.mount("configMap")
    config_path = PurePosixPath(container["args"][container["args"].index("--config") + 1])
    assert container["args"][0] == "run"
    assert str(config_path.parent) == config_mount["mountPath"] == "/etc/bridge"
    assert "subPath" not in config_mount, "a subPath mount never sees ConfigMap updates"
    configmap = one(rendered.manifests, "ConfigMap", config_volume["configMap"]["name"])
    assert config_path.name in configmap["data"]

    secret_volume, secret_mount = rendered.mount("projected")
    example = secret_example()
    sources = [source["secret"]["name"] for source in secret_volume["projected"]["sources"]]
    assert sources == [example["metadata"]["name"]]
    assert secret_mount["mountPath"] == SECRETS_DIR
    secret_files = re.findall(r"secret_file:\s*\"?([^\"\s]+)", rendered.config_text)
    assert secret_files
    for path in map(PurePosixPath, secret_files):
        assert str(path.parent) == SECRETS_DIR
        assert path.name in example["stringData"]


def test_no_secret_value_is_committed(rendered: Rendered) -> None:
    assert not find(rendered.manifests, "Secret")
    assert all("REPLACE-ME" in value for value in secret_example()["stringData"].values())


def test_kafka_bootstrap_comes_from_a_rendered_configmap(rendered: Rendered) -> None:
    (source,) = rendered.container()["envFrom"]
    data = one(rendered.manifests, "ConfigMap", source["configMapRef"]["name"])["data"]
    assert data["KAFKA_BOOTSTRAP_SERVERS"]


# ---- Dockerfile --------------------------------------------------------------------------------


@dataclass
class Stage:
    """One build stage: its base image, its name, its instructions after FROM."""

    image: str
    name: str | None
    instructions: list[tuple[str, str]]

    def all(self, instruction: str) -> list[str]:
        return [rest for name, rest in self.instructions if name == instruction]

    def last(self, instruction: str) -> str:
        found = self.all(instruction)
        assert found, f"no {instruction} in stage {self.name or self.image}"
        return found[-1]


def dockerfile_stages() -> list[Stage]:
    """The Dockerfile's stages, with ARG defaults substituted in FROM lines."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), " ".join(rest.split())))
        pending = ""
    arguments: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, rest in instructions:
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            arguments[name] = default
        elif keyword == "FROM":
            image, *alias = rest.split()
            for name, value in arguments.items():
                image = image.replace(f"${{{name}}}", value)
            stages.append(Stage(image, alias[-1] if alias else None, []))
        else:
            stages[-1].instructions.append((keyword, rest))
    return stages


def copy_parts(rest: str) -> tuple[dict[str, str], list[str], str]:
    """A COPY instruction's flags, sources and destination."""
    words = rest.split()
    flags = dict(word[2:].partition("=")[::2] for word in words if word.startswith("--"))
    paths = [word for word in words if not word.startswith("--")]
    return flags, paths[:-1], paths[-1]


def dockerfile_user_id() -> int:
    """The numeric user the final image runs as."""
    return int(dockerfile_stages()[-1].last("USER").partition(":")[0])


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (relative to the context) out of the build context."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").strip("/")
        if any(fnmatch.fnmatchcase(prefix, glob) for prefix in prefixes):
            ignored = not negated
    return ignored


def test_base_images_are_pinned_python_3_11_slim() -> None:
    *based, final = dockerfile_stages()
    assert len(based) >= 2, "a builder, and a runtime stage the final one is copied from"
    assert final.image == "scratch", "the final stage is the runtime tree copied whole"
    for stage in based:
        assert re.fullmatch(
            r"python:3\.11\.\d+-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", stage.image
        )
    assert len({stage.image for stage in based}) == 1, "the copied virtualenv needs the same base"


def test_final_stage_is_non_root_and_free_of_build_tools() -> None:
    *builders, final = dockerfile_stages()
    user = final.last("USER")
    assert re.fullmatch(r"\d+(:\d+)?", user), "numeric, so runAsNonRoot can verify it"
    assert dockerfile_user_id() == 10001
    assert any("pip wheel" in run for stage in builders for run in stage.all("RUN"))
    for run in final.all("RUN"):
        assert not re.search(r"\b(apt-get|apk|gcc|make|pip|build-essential)\b", run), run
    builder_names = {stage.name for stage in builders}
    copied = [copy_parts(rest) for rest in final.all("COPY")]
    assert all(flags["from"] in builder_names for flags, _, _ in copied if "from" in flags)
    (venv,) = [dest for flags, sources, dest in copied if flags.get("from") == "builder"]
    assert venv == "/opt/venv"
    assert [sources for flags, sources, _ in copied if flags.get("from") == "runtime"] == [["/"]]
    path = next(env for env in final.all("ENV") if "PATH=" in env)
    assert f"{venv}/bin:" in path, "the console scripts of the copied virtualenv are on PATH"


def test_entrypoint_is_the_console_script_and_cmd_runs_the_mounted_config() -> None:
    final = dockerfile_stages()[-1]
    entrypoint = json.loads(final.last("ENTRYPOINT"))
    command = json.loads(final.last("CMD"))
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint == ["bridge"] and scripts["bridge"] == "bridge.cli:main"
    (container,) = containers(render())
    assert command == container["args"] == ["run", "--config", "/etc/bridge/bridge.yaml"]


def test_copied_files_exist_and_are_in_the_build_context() -> None:
    sources = [
        source
        for stage in dockerfile_stages()
        for flags, stage_sources, _ in map(copy_parts, stage.all("COPY"))
        if "from" not in flags
        for source in stage_sources
    ]
    assert {"pyproject.toml", "README.md", "bridge/", "schemas/"} <= set(sources)
    for source in sources:
        assert (REPO / source).exists(), source
        assert not dockerignored(source), f"{source} is excluded by .dockerignore"
    for local_state in (".git/HEAD", ".venv/bin/python", "tests/unit/test_deploy.py"):
        assert dockerignored(local_state), local_state


def test_schemas_land_where_the_config_reads_them(rendered: Rendered) -> None:
    final = dockerfile_stages()[-1]
    (destination,) = [
        dest for _, sources, dest in map(copy_parts, final.all("COPY")) if sources == ["schemas/"]
    ]
    assert PurePosixPath(destination) == PurePosixPath(IMAGE_SCHEMAS_DIR)
    assert yaml.safe_load(rendered.config_text)["schemas"]["directory"] == IMAGE_SCHEMAS_DIR
    assert (REPO / "schemas" / "transaction_outcome.avsc").is_file()
    assert int(final.last("EXPOSE")) == rendered.config.metrics.port


# ---- helpers -------------------------------------------------------------------------------------


def health_routes() -> set[str]:
    """The paths bridge.ops.health serves."""
    app = health_app(CollectorRegistry(), lambda: 0.0, lambda: {})
    return {resource.canonical for resource in app.router.resources()}


def seconds(duration: str) -> int:
    """A Prometheus duration like ``30s`` or ``1m`` in seconds."""
    match = re.fullmatch(r"(\d+)([smh])", duration)
    assert match, f"not a duration: {duration}"
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]
