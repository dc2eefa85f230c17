"""The deployment files: Dockerfile and Kustomize manifests, checked offline against each other,
against the Kubernetes OpenAPI schemas (``kubernetes-validate`` bundles them), and against the
bridge itself (its CLI, its health routes, its configuration)."""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from bridge import __version__
from bridge.config.loader import load_config
from bridge.core.settings import Config
from bridge.ops.health import health_app
from tests.k8s_render import (
    Manifest,
    Unsupported,
    containers,
    find,
    is_local_config,
    load_documents,
    one,
    render,
)

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = {"base": K8S / "base", "production": K8S / "overlays" / "production"}
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
SECRET_EXAMPLE = K8S / "base" / "secret.example.yaml"
# Oldest Kubernetes minor the manifests support, and the newest the validator bundles.
KUBERNETES_VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())
# Custom resources: checked by hand below (their operators' CRD schemas are not bundled).
CUSTOM_KINDS = {"monitoring.coreos.com/v1": "ServiceMonitor", "keda.sh/v1alpha1": "ScaledObject"}
# Where the image and the pod put things: the test rewrites these in a copy of the ConfigMap's
# bridge.yaml, since neither path exists on the machine running the tests.
SECRETS_DIR = "/var/run/secrets/bridge"
IMAGE_SCHEMAS_DIR = "/opt/bridge/schemas"
# App.run flushes the producer for up to this long after draining, before the process exits.
PRODUCER_CLOSE_SECONDS = 10.0


@dataclass
class Rendered:
    """One rendered kustomization and the bridge configuration its ConfigMap carries."""

    manifests: list[Manifest]
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


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """Each kustomization (base, production overlay) rendered, with its bridge configuration."""
    manifests = render(OVERLAYS[request.param])
    config_text = one(manifests, "ConfigMap", "bridge-config")["data"]["bridge.yaml"]
    local = localize(config_text, tmp_path_factory.mktemp(request.param))
    return Rendered(manifests, config_text, local, load_config(local, environ={}))


def labels_select(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector selects objects carrying ``labels``."""
    assert set(selector) <= {"matchLabels"}, "only matchLabels selectors are checked here"
    match_labels: dict[str, str] = selector["matchLabels"]
    return bool(match_labels) and match_labels.items() <= labels.items()


# ---- Kustomize rendering -----------------------------------------------------------------------


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_test_renderer_agrees_with_kubectl_kustomize(overlay: str) -> None:
    assert shutil.which("kubectl"), "kubectl (Debian package kubectl) is needed for this check"
    output = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAYS[overlay])],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout

    def by_identity(manifests: list[Manifest]) -> dict[tuple[str, ...], Manifest]:
        return {
            (
                m["apiVersion"],
                m["kind"],
                m["metadata"].get("namespace", ""),
                m["metadata"]["name"],
            ): m
            for m in manifests
        }

    kubectl = by_identity([doc for doc in yaml.safe_load_all(output) if doc])
    assert by_identity(render(OVERLAYS[overlay])) == kubectl


def test_every_manifest_kind_is_present(rendered: Rendered) -> None:
    kinds = sorted(m["kind"] for m in rendered.manifests)
    expected = {
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "ScaledObject",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    }
    assert expected <= set(kinds)
    assert kinds.count("Deployment") == 1


def test_production_overlay_runs_three_replicas_in_its_namespace() -> None:
    manifests = render(OVERLAYS["production"])
    namespace = one(manifests, "Namespace")
    assert one(manifests, "Deployment")["spec"]["replicas"] == 3
    assert one(manifests, "ScaledObject")["spec"]["minReplicaCount"] == 3
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for manifest in manifests:
        if manifest["kind"] != "Namespace":
            assert manifest["metadata"]["namespace"] == namespace["metadata"]["name"]
    (container,) = containers(manifests)
    registry_path, _, tag = container["image"].rpartition(":")
    assert "/" in registry_path, "production pulls from a registry"
    assert tag == __version__, "the image tag follows the release"


# ---- schemas of built-in kinds, required fields of custom resources ------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_builtin_manifests_validate_against_kubernetes_openapi(
    rendered: Rendered, version: str
) -> None:
    builtin = [m for m in rendered.manifests if m["apiVersion"] not in CUSTOM_KINDS]
    assert {m["kind"] for m in rendered.manifests} - {m["kind"] for m in builtin} == set(
        CUSTOM_KINDS.values()
    )
    for manifest in [*builtin, secret_example()]:
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(part) for part in exc.path)
            pytest.fail(
                f"{manifest['kind']} {manifest['metadata']['name']}: {where}: {exc.message}"
            )


def test_service_monitor_has_what_prometheus_operator_requires(rendered: Rendered) -> None:
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
    kafka_env = one(rendered.manifests, "ConfigMap", "bridge-kafka")["data"]
    assert metadata["bootstrapServers"] == kafka_env["KAFKA_BOOTSTRAP_SERVERS"]
    assert metadata["consumerGroup"] == config.kafka.group_id
    assert metadata["topic"] == config.topics.source
    assert int(metadata["lagThreshold"]) > 0
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= config.topics.partitions
    assert spec["minReplicaCount"] == rendered.deployment()["spec"]["replicas"]


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

    secret_volume, secret_mount = rendered.mount("secret")
    example = secret_example()
    assert secret_volume["secret"]["secretName"] == example["metadata"]["name"]
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


# ---- NetworkPolicy ---------------------------------------------------------------------------

# The local-config ConfigMap with the NetworkPolicy's Kafka and registry ranges (never rendered).
NETWORK_PARAMETERS = K8S / "base" / "network-parameters.yaml"
NETWORK_CONFIGMAP = "bridge-network"
# The base's placeholders lie in TEST-NET-1 (RFC 5737): documentation only, never routed.
PLACEHOLDER_NETWORK = ipaddress.IPv4Network("192.0.2.0/24")
KUBE_DNS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}


def kustomization_of(directory: Path) -> dict[str, Any]:
    kustomization: dict[str, Any] = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return kustomization


def network_parameters(overlay: str) -> dict[str, str]:
    """The bridge-network values a kustomization sets, read from its files rather than rendered:
    the base's network-parameters.yaml, then the overlay's ``behavior: merge`` literals."""
    (base,) = load_documents(NETWORK_PARAMETERS)
    assert base["metadata"]["name"] == NETWORK_CONFIGMAP
    data: dict[str, str] = dict(base["data"])
    if overlay != "base":
        for generator in kustomization_of(OVERLAYS[overlay]).get("configMapGenerator", []):
            if generator["name"] == NETWORK_CONFIGMAP:
                assert generator["behavior"] == "merge"
                data.update(literal.split("=", 1) for literal in generator["literals"])
    return data


def egress_rule(policy: dict[str, Any], port: int, protocol: str = "TCP") -> dict[str, Any]:
    """The one egress rule that opens ``port``."""
    (rule,) = [
        rule
        for rule in policy["egress"]
        if {"port": port, "protocol": protocol} in rule.get("ports", [])
    ]
    result: dict[str, Any] = rule
    return result


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_network_policy_allows_only_metrics_in_and_dns_kafka_registry_https_out(
    overlay: str,
) -> None:
    manifests = render(OVERLAYS[overlay])
    policy = one(manifests, "NetworkPolicy")["spec"]
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels_select(policy["podSelector"], pod_labels)
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert [rule["ports"] for rule in policy["ingress"]] == [
        [{"port": "metrics", "protocol": "TCP"}]
    ]
    assert all("from" not in rule for rule in policy["ingress"])

    # Every egress rule names its peers and its ports: no rule opens a port to any address.
    for rule in policy["egress"]:
        assert rule.get("to"), f"egress rule without peers (any address): {rule}"
        assert rule.get("ports"), f"egress rule without ports (every port): {rule}"
    parameters = network_parameters(overlay)
    registry_port = int(parameters["REGISTRY_PORT"])
    opened = [
        (port["port"], port["protocol"]) for rule in policy["egress"] for port in rule["ports"]
    ]
    assert sorted(opened, key=str) == sorted(
        [
            (53, "UDP"),
            (53, "TCP"),
            (9092, "TCP"),
            (9093, "TCP"),
            (registry_port, "TCP"),
            (443, "TCP"),
        ],
        key=str,
    )

    dns = egress_rule(policy, 53, "UDP")
    assert dns["to"] == [KUBE_DNS_PEER], "DNS only to the cluster DNS"
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]

    kafka = egress_rule(policy, 9092)
    assert kafka["to"] == [{"ipBlock": {"cidr": parameters["KAFKA_CIDR"]}}]
    assert kafka["ports"] == [{"port": 9092, "protocol": "TCP"}, {"port": 9093, "protocol": "TCP"}]
    brokers = one(manifests, "ConfigMap", "bridge-kafka")["data"]["KAFKA_BOOTSTRAP_SERVERS"]
    for broker in brokers.split(","):
        assert {"port": int(broker.rpartition(":")[2]), "protocol": "TCP"} in kafka["ports"]

    registry = egress_rule(policy, registry_port)
    assert registry["to"] == [{"ipBlock": {"cidr": parameters["REGISTRY_CIDR"]}}]
    assert registry["ports"] == [{"port": registry_port, "protocol": "TCP"}]
    # An integer: the string "8081" would be a (malformed) port name.
    assert type(registry["ports"][0]["port"]) is int

    blocks = [peer["ipBlock"] for peer in egress_rule(policy, 443)["to"]]
    ipv4 = next(block for block in blocks if block["cidr"] == "0.0.0.0/0")
    excluded = [ipaddress.IPv4Network(cidr) for cidr in ipv4["except"]]
    for private in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"):
        assert any(ipaddress.IPv4Network(private).subnet_of(net) for net in excluded), private


def test_network_ranges_are_placeholders_in_the_base_and_set_in_production() -> None:
    base, production = network_parameters("base"), network_parameters("production")
    assert set(base) == set(production) == {"KAFKA_CIDR", "REGISTRY_CIDR", "REGISTRY_PORT"}
    for key in ("KAFKA_CIDR", "REGISTRY_CIDR"):
        assert ipaddress.IPv4Network(base[key]).subnet_of(PLACEHOLDER_NETWORK), key
        network = ipaddress.ip_network(production[key])  # strict: no host bits set
        assert network.prefixlen > 0, f"{key}: any address"
        assert not network.overlaps(PLACEHOLDER_NETWORK), f"{key}: still the placeholder"
        assert ipaddress.ip_address("169.254.169.254") not in network, f"{key}: cloud metadata"
    for parameters in (base, production):
        assert 0 < int(parameters["REGISTRY_PORT"]) < 65536


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_network_parameters_are_local_config_and_not_rendered(overlay: str) -> None:
    manifests = render(OVERLAYS[overlay])
    assert not find(manifests, "ConfigMap", NETWORK_CONFIGMAP)
    assert not [m for m in manifests if is_local_config(m)]
    internal = one(
        render(OVERLAYS[overlay], include_local_config=True), "ConfigMap", NETWORK_CONFIGMAP
    )
    assert internal["metadata"]["annotations"] == {"config.kubernetes.io/local-config": "true"}
    assert internal["data"] == network_parameters(overlay)


def test_every_kustomization_setting_network_ranges_repeats_the_base_replacements() -> None:
    """Kustomize runs a kustomization's replacements when it builds that kustomization, so values an
    overlay merges into bridge-network reach the NetworkPolicy only through its own copy."""
    base = kustomization_of(OVERLAYS["base"])["replacements"]
    assert {r["source"]["name"] for r in base} == {NETWORK_CONFIGMAP}
    setting = [
        path.parent
        for path in K8S.rglob("kustomization.yaml")
        if any(
            generator["name"] == NETWORK_CONFIGMAP
            for generator in kustomization_of(path.parent).get("configMapGenerator", [])
        )
    ]
    assert OVERLAYS["production"] in setting
    for directory in setting:
        assert kustomization_of(directory).get("replacements") == base, directory


# ---- the test renderer: replacements and local-config objects -----------------------------------


def write_kustomization(
    directory: Path, kustomization: dict[str, Any], resources: dict[str, Manifest]
) -> Path:
    """A kustomization directory with one file per resource (listed first in ``resources``)."""
    directory.mkdir(parents=True)
    for name, manifest in resources.items():
        (directory / name).write_text(yaml.safe_dump(manifest))
    listed = [*resources, *kustomization.get("resources", [])]
    (directory / "kustomization.yaml").write_text(
        yaml.safe_dump({**kustomization, "resources": listed})
    )
    return directory


def parameters_configmap(cidr: str, port: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "params",
            "annotations": {"config.kubernetes.io/local-config": "true"},
        },
        "data": {"CIDR": cidr, "PORT": port},
    }


def small_policy() -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "policy"},
        "spec": {
            "podSelector": {},
            "egress": [{"to": [{"ipBlock": {"cidr": "192.0.2.0/32"}}], "ports": [{"port": 9092}]}],
        },
    }


def replacement(field: str, *paths: str) -> dict[str, Any]:
    return {
        "source": {"kind": "ConfigMap", "name": "params", "fieldPath": f"data.{field}"},
        "targets": [
            {"select": {"kind": "NetworkPolicy", "name": "policy"}, "fieldPaths": [*paths]}
        ],
    }


REPLACEMENTS = [
    replacement("CIDR", "spec.egress.0.to.0.ipBlock.cidr"),
    replacement("PORT", "spec.egress.0.ports.0.port"),
]


def small_base(directory: Path, **changes: Any) -> Path:
    """A base: the parameters ConfigMap, a NetworkPolicy, and the replacements between them."""
    return write_kustomization(
        directory,
        {"replacements": REPLACEMENTS, **changes},
        {
            "params.yaml": parameters_configmap("198.51.100.0/24", "8443"),
            "policy.yaml": small_policy(),
        },
    )


def rendered_egress(manifests: list[Manifest]) -> tuple[str, Any]:
    (rule,) = one(manifests, "NetworkPolicy")["spec"]["egress"]
    return rule["to"][0]["ipBlock"]["cidr"], rule["ports"][0]["port"]


def test_renderer_replacements_copy_values_keeping_the_field_type(tmp_path: Path) -> None:
    base = small_base(tmp_path / "base")
    manifests = render(base)
    assert rendered_egress(manifests) == ("198.51.100.0/24", 8443)
    assert type(rendered_egress(manifests)[1]) is int
    assert not find(manifests, "ConfigMap"), "the local-config source is not rendered"
    assert one(render(base, include_local_config=True), "ConfigMap", "params")["data"]["PORT"] == (
        "8443"
    )


@pytest.mark.parametrize(("annotation", "local"), [("true", True), ("false", False), (None, False)])
def test_renderer_drops_local_config_unless_false(annotation: str | None, local: bool) -> None:
    metadata: dict[str, Any] = {"name": "params"}
    if annotation is not None:
        metadata["annotations"] = {"config.kubernetes.io/local-config": annotation}
    assert is_local_config({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}) is local


def test_renderer_overlay_values_reach_targets_only_through_overlay_replacements(
    tmp_path: Path,
) -> None:
    """As in kustomize: the base's replacements ran with the base's value; an overlay that merges a
    new value must run the replacements again, and its merge runs before its replacements."""
    small_base(tmp_path / "base")
    merge = [
        {"name": "params", "behavior": "merge", "literals": ["CIDR=203.0.113.8/29", "PORT=9443"]}
    ]
    without = write_kustomization(
        tmp_path / "without", {"resources": ["../base"], "configMapGenerator": merge}, {}
    )
    with_replacements = write_kustomization(
        tmp_path / "with",
        {
            "resources": ["../base"],
            "namespace": "elsewhere",
            "configMapGenerator": merge,
            "replacements": REPLACEMENTS,
        },
        {},
    )
    assert rendered_egress(render(without)) == ("198.51.100.0/24", 8443)
    assert rendered_egress(render(with_replacements)) == ("203.0.113.8/29", 9443)
    assert not find(render(with_replacements), "ConfigMap")


@pytest.mark.parametrize(
    "change",
    [
        {"targets": [{**REPLACEMENTS[0]["targets"][0], "options": {"delimiter": "/", "index": 0}}]},
        {"targets": [{**REPLACEMENTS[0]["targets"][0], "options": {"create": True}}]},
        {"targets": [{**REPLACEMENTS[0]["targets"][0], "reject": [{"kind": "Deployment"}]}]},
        {"source": {**REPLACEMENTS[0]["source"], "options": {"delimiter": "/", "index": 0}}},
        {"source": {"kind": "ConfigMap", "name": "params"}},
        {
            "targets": [
                {"select": {"kind": "NetworkPolicy", "labelSelector": "a=b"}, "fieldPaths": ["a"]}
            ]
        },
        {
            "targets": [
                {"select": {"kind": "NetworkPolicy"}, "fieldPaths": ["spec.egress.[a=b].to"]}
            ]
        },
        {"targets": [{"select": {"kind": "NetworkPolicy"}, "fieldPaths": ["spec.egress.*.to"]}]},
        {"source": {"kind": "ConfigMap", "name": "params", "fieldPath": "data"}},
    ],
)
def test_renderer_rejects_unsupported_replacement_features(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    base = small_base(tmp_path / "base", replacements=[{**REPLACEMENTS[0], **change}])
    with pytest.raises(Unsupported):
        render(base)


def test_renderer_rejects_a_replacement_file(tmp_path: Path) -> None:
    base = small_base(tmp_path / "base", replacements=[{"path": "replacements.yaml"}])
    with pytest.raises(Unsupported):
        render(base)


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (replacement("CIDR", "spec.egress.0.to.1.ipBlock.cidr"), "missing"),
        (replacement("CIDR", "spec.ingress.0.from"), "missing"),
        (replacement("MISSING", "spec.egress.0.to.0.ipBlock.cidr"), "missing"),
        (replacement("CIDR", "spec.egress.0.ports.0.port"), "integer field"),
        (replacement("CIDR", "spec.egress.to"), "field to of a list"),
        (
            {**REPLACEMENTS[0], "targets": [{"select": {"kind": "Service"}, "fieldPaths": ["a"]}]},
            "selects nothing",
        ),
        ({**REPLACEMENTS[0], "source": {"kind": "Secret", "fieldPath": "data.a"}}, "selects 0"),
    ],
)
def test_renderer_refuses_replacements_that_cannot_apply(
    tmp_path: Path, broken: dict[str, Any], message: str
) -> None:
    """Missing fields and unconvertible values fail as in kustomize v5 (checked with kubectl
    kustomize 1.32); a target selecting nothing, which kustomize skips, fails here too, so a typo
    cannot leave a placeholder in place unnoticed."""
    base = small_base(tmp_path / "base", replacements=[broken])
    with pytest.raises(ValueError, match=message):
        render(base)


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
    stages = dockerfile_stages()
    assert len(stages) >= 2, "multi-stage: a builder and a final stage"
    for stage in stages:
        assert re.fullmatch(
            r"python:3\.11\.\d+-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", stage.image
        )
    assert len({stage.image for stage in stages}) == 1, "the copied virtualenv needs the same base"


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
    from_builder = [(sources, dest) for flags, sources, dest in copied if "from" in flags]
    assert all(flags["from"] in builder_names for flags, _, _ in copied if "from" in flags)
    (venv,) = [dest for _, dest in from_builder]
    path = next(env for env in final.all("ENV") if "PATH=" in env)
    assert f"{venv}/bin:" in path, "the console scripts of the copied virtualenv are on PATH"


def test_entrypoint_is_the_console_script_and_cmd_runs_the_mounted_config() -> None:
    final = dockerfile_stages()[-1]
    entrypoint = json.loads(final.last("ENTRYPOINT"))
    command = json.loads(final.last("CMD"))
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint == ["bridge"] and scripts["bridge"] == "bridge.cli:main"
    deployment = render(OVERLAYS["base"])
    (container,) = containers(deployment)
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
    assert f'directory: "{IMAGE_SCHEMAS_DIR}"' in rendered.config_text
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
