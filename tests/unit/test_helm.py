"""The Helm chart (deploy/helm/transaction-webhook-bridge), rendered and linted by the real helm.

Every rendered object of a built-in kind is validated against the Kubernetes OpenAPI schemas of each
supported Kubernetes version (``kubernetes-validate`` ships them offline, strict: unknown fields
fail). The custom resources (ServiceMonitor, PrometheusRule, KEDA ScaledObject) have no schema
offline: they are checked structurally against the hand-written subsets of their CRDs below
(apiVersion, kind, the fields their operators require, the types of the fields the chart sets).

helm is built once from source into .cache/go-bin (``make helm-tools``); the tests skip, with the
reason, only when it cannot be built."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from bridge import __version__
from tests.k8s_render import (
    BUILD_TIMEOUT_SECONDS,
    CHART,
    PRODUCTION_VALUES,
    RenderError,
    find,
    helm,
    one,
    render,
    render_text,
)

REPO = Path(__file__).resolve().parents[2]
# The first test may build helm (a few minutes, once): see tests/k8s_render.py.
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_SECONDS + 120)
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yaml"
# The oldest Kubernetes minor the chart supports (Chart.yaml kubeVersion), one between, and the
# newest the validator ships.
KUBERNETES_VERSIONS = (
    "1.29",
    "1.31",
    ".".join(kubernetes_validate.utils.latest_version().split(".")[:2]),
)
VALUES = {"default": (), "production": (PRODUCTION_VALUES,)}
# Every optional object on: the custom resources too.
EVERYTHING = {
    "serviceMonitor.enabled": "true",
    "prometheusRule.enabled": "true",
    "keda.enabled": "true",
    "kafka.credentialsSecret.name": "kafka-credentials",
    "kafka.saslPasswordSecret.name": "kafka-sasl",
    "kafka.env.KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
}
PLACEHOLDER = ipaddress.ip_network("192.0.2.0/24")
KUBE_DNS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}

# Subsets of the CRD schemas (prometheus-operator v0.7x monitoring.coreos.com/v1, KEDA v2
# keda.sh/v1alpha1): the required fields and the types of every field the chart sets.
_STR = {"type": "string", "minLength": 1}
_INT = {"type": "integer"}
CUSTOM_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "properties": {
                    "jobLabel": _STR,
                    "selector": {
                        "type": "object",
                        "properties": {"matchLabels": {"type": "object"}},
                        "additionalProperties": False,
                    },
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {
                                "port": _STR,
                                "path": {"type": "string", "pattern": "^/"},
                                "interval": {
                                    "type": "string",
                                    "pattern": "^(0|([0-9]+(ms|s|m|h))+)$",
                                },
                                "scrapeTimeout": {
                                    "type": "string",
                                    "pattern": "^(0|([0-9]+(ms|s|m|h))+)$",
                                },
                            },
                            "additionalProperties": False,
                        },
                    },
                },
                "additionalProperties": False,
            }
        },
    },
    ("monitoring.coreos.com/v1", "PrometheusRule"): {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "groups": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": _STR,
                                "interval": _STR,
                                "rules": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["expr"],
                                        "properties": {
                                            "alert": _STR,
                                            "record": _STR,
                                            "expr": {"type": ["string", "integer"]},
                                            "for": _STR,
                                            "keep_firing_for": _STR,
                                            "labels": {
                                                "type": "object",
                                                "additionalProperties": {"type": "string"},
                                            },
                                            "annotations": {
                                                "type": "object",
                                                "additionalProperties": {"type": "string"},
                                            },
                                        },
                                        "additionalProperties": False,
                                        "oneOf": [
                                            {"required": ["alert"]},
                                            {"required": ["record"]},
                                        ],
                                    },
                                },
                            },
                        },
                    }
                },
                "additionalProperties": False,
            }
        },
    },
    ("keda.sh/v1alpha1", "ScaledObject"): {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["scaleTargetRef", "triggers"],
                "properties": {
                    "scaleTargetRef": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"apiVersion": _STR, "kind": _STR, "name": _STR},
                        "additionalProperties": False,
                    },
                    "pollingInterval": _INT,
                    "cooldownPeriod": _INT,
                    "minReplicaCount": _INT,
                    "maxReplicaCount": _INT,
                    "advanced": {"type": "object"},
                    "triggers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["type", "metadata"],
                            "properties": {
                                "type": _STR,
                                "metadata": {
                                    "type": "object",
                                    "additionalProperties": {"type": "string"},
                                },
                                "authenticationRef": {
                                    "type": "object",
                                    "required": ["name"],
                                },
                            },
                            "additionalProperties": False,
                        },
                    },
                },
                "additionalProperties": False,
            }
        },
    },
}


def is_custom(manifest: dict[str, Any]) -> bool:
    return (manifest["apiVersion"], manifest["kind"]) in CUSTOM_SCHEMAS


def refused(*, set_values: dict[str, str]) -> str:
    """helm's error when it refuses these values."""
    with pytest.raises(RenderError) as caught:
        render_text(set_values=set_values, check=False)
    return str(caught.value)


# ---- helm lint, schemas --------------------------------------------------------------------


@pytest.mark.parametrize("values", sorted(VALUES))
def test_helm_lint_passes_strict(values: str) -> None:
    args = ["lint", "--strict", str(CHART)]
    for path in VALUES[values]:
        args += ["--values", str(path)]
    result = helm(*args)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", sorted(VALUES))
def test_every_object_validates_against_kubernetes_openapi(values: str, version: str) -> None:
    manifests = render(*VALUES[values], set_values=EVERYTHING, kube_version=f"v{version}.0")
    kinds = {m["kind"] for m in manifests}
    assert {
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PrometheusRule",
        "ScaledObject",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    } <= kinds
    for manifest in manifests:
        where = f"{manifest['kind']} {manifest['metadata']['name']}"
        if is_custom(manifest):
            schema = CUSTOM_SCHEMAS[manifest["apiVersion"], manifest["kind"]]
            try:
                jsonschema.validate(manifest, schema)
            except jsonschema.ValidationError as exc:
                pytest.fail(f"{where}: {exc.json_path}: {exc.message}")
            continue
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(part) for part in exc.path)
            pytest.fail(f"{where} (Kubernetes {version}): {path}: {exc.message}")


def test_custom_resources_are_off_by_default_and_on_in_production() -> None:
    custom = {"ServiceMonitor", "PrometheusRule", "ScaledObject"}
    assert not custom & {m["kind"] for m in render()}
    assert custom <= {m["kind"] for m in render(PRODUCTION_VALUES)}


def test_values_schema_is_valid_json_schema_and_accepts_the_values_files() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(defaults, schema)
    jsonschema.validate(merged(defaults, yaml.safe_load(PRODUCTION_VALUES.read_text())), schema)


def merged(base: Any, override: Any) -> Any:
    """Values merged as helm does: maps key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: merged(base.get(k), v) for k, v in override.items()}}
    return override


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("replicaCountt", "2"),  # unknown key (a typo)
        ("securityContext.readOnlyRootFilesystem", "false"),
        ("podSecurityContext.runAsNonRoot", "false"),
        ("kafka.env.KAFKA_SASL_PASSWORD", "inline-secret"),  # secrets only by Secret reference
        ("networkPolicy.kafka.cidrs[0]", "kafka.example.com"),
        ("replicaCount", "0"),
    ],
)
def test_values_schema_refuses_bad_values(key: str, value: str) -> None:
    assert "values don't meet the specifications of the schema" in refused(set_values={key: value})


def test_chart_app_version_follows_the_bridge_release() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    (container,) = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"transaction-webhook-bridge:{__version__}"


# ---- invariants ------------------------------------------------------------------------------


@pytest.mark.parametrize("values", sorted(VALUES))
def test_pod_is_non_root_read_only_probed_and_drains_before_sigkill(values: str) -> None:
    manifests = render(*VALUES[values])
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    (config_map,) = [m for m in find(manifests, "ConfigMap") if "bridge.yaml" in m["data"]]
    config = yaml.safe_load(config_map["data"]["bridge.yaml"])
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > config["delivery"]["shutdown_grace_seconds"] + 10


def test_grace_period_below_the_bridge_shutdown_is_refused() -> None:
    message = refused(set_values={"config.bridge.delivery.shutdown_grace_seconds": "40"})
    assert "terminationGracePeriodSeconds (45) must exceed" in message
    render(
        set_values={
            "config.bridge.delivery.shutdown_grace_seconds": "40",
            "terminationGracePeriodSeconds": "60",
        }
    )


def test_keda_beyond_the_partition_count_is_refused() -> None:
    message = refused(set_values={"keda.enabled": "true", "keda.maxReplicaCount": "7"})
    assert "exceeds config.bridge.topics.partitions (6)" in message


def test_no_secret_is_rendered_only_references() -> None:
    text = render_text(PRODUCTION_VALUES, set_values=EVERYTHING)
    manifests = yaml.safe_load_all(text)
    assert not [m for m in manifests if m and m["kind"] == "Secret"]
    assert "REPLACE-ME" not in text
    pod = one(render(set_values=EVERYTHING), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (password,) = [env for env in container["env"] if env["name"] == "KAFKA_SASL_PASSWORD"]
    assert password == {
        "name": "KAFKA_SASL_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "kafka-sasl", "key": "password"}},
    }
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["kafka-credentials"]["secret"]["secretName"] == "kafka-credentials"
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert mounts["kafka-credentials"]["mountPath"] == "/var/run/secrets/kafka"


def test_several_webhook_secrets_share_one_directory() -> None:
    pod = one(
        render(set_values={"webhookSecrets.secretNames": "{a-secrets,b-secrets}"}), "Deployment"
    )["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "webhook-secrets"]
    assert [s["secret"]["name"] for s in volume["projected"]["sources"]] == [
        "a-secrets",
        "b-secrets",
    ]


def test_an_existing_configmap_replaces_the_inline_configuration() -> None:
    settings = {
        "config.existingConfigMap": "my-webhooks",
        "keda.enabled": "true",
        "keda.consumerGroup": "g",
        "keda.topic": "t",
    }
    manifests = render(set_values=settings)
    assert [m["metadata"]["name"] for m in find(manifests, "ConfigMap")] == [
        "transaction-webhook-bridge-kafka"
    ]
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == "my-webhooks"
    metadata = one(manifests, "ScaledObject")["spec"]["triggers"][0]["metadata"]
    assert (metadata["consumerGroup"], metadata["topic"]) == ("g", "t")
    del settings["keda.topic"]
    assert "set keda.consumerGroup and keda.topic" in refused(set_values=settings)


# ---- several ConfigMaps, one configuration directory -----------------------------------------

EXTRA_CONFIGMAPS = {"config.extraConfigMaps": "{team-a-webhooks,team-b-webhooks}"}
SECRETS_DIR = "/var/run/secrets/bridge"
IMAGE_SCHEMAS_DIR = "/opt/bridge/schemas"


def config_volume(manifests: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The container and its configuration volume."""
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    result: tuple[dict[str, Any], dict[str, Any]] = (container, volume)
    return result


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_several_configmaps_are_projected_into_one_directory_the_bridge_reads(
    version: str,
) -> None:
    manifests = render(set_values={**EVERYTHING, **EXTRA_CONFIGMAPS}, kube_version=f"v{version}.0")
    container, volume = config_volume(manifests)
    assert "configMap" not in volume
    assert volume["projected"]["sources"] == [
        {"configMap": {"name": "transaction-webhook-bridge-config"}},
        {"configMap": {"name": "team-a-webhooks"}},
        {"configMap": {"name": "team-b-webhooks"}},
    ]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert mount == {"name": "config", "mountPath": "/etc/bridge", "readOnly": True}
    assert container["args"] == ["run", "--config", "/etc/bridge"], "the directory itself"
    assert {"name": "BRIDGE_CONFIG", "value": "/etc/bridge"} in container["env"]
    for manifest in manifests:
        if not is_custom(manifest):
            kubernetes_validate.validate(manifest, version, strict=True)

    existing = render(set_values={**EXTRA_CONFIGMAPS, "config.existingConfigMap": "my-base"})
    sources = config_volume(existing)[1]["projected"]["sources"]
    assert [source["configMap"]["name"] for source in sources] == [
        "my-base",
        "team-a-webhooks",
        "team-b-webhooks",
    ]
    container, volume = config_volume(render())
    assert volume["configMap"] == {"name": "transaction-webhook-bridge-config"}, "as before"
    assert container["args"] == ["run", "--config", "/etc/bridge/bridge.yaml"]


def test_extra_configmaps_the_bridge_would_not_read_are_refused() -> None:
    message = refused(set_values={**EXTRA_CONFIGMAPS, "config.key": "bridge.conf"})
    assert "config.key (bridge.conf) must end in .yaml or .yml" in message
    own = {"config.extraConfigMaps": "{transaction-webhook-bridge-config}"}
    assert "the configuration's own ConfigMap" in refused(set_values=own)
    schema = "values don't meet the specifications of the schema"
    assert schema in refused(set_values={"config.extraConfigMaps": "{Team_A}"})
    assert schema in refused(set_values={"config.extraConfigMaps": "{a,a}"})


def test_the_bridge_loads_the_projected_directory_as_kubelet_writes_it(tmp_path: Path) -> None:
    """The chart's ConfigMap and two more, written into one directory as kubelet projects them:
    the bridge reads it as the container's arguments say, webhooks joined in file name order."""
    from bridge.config.loader import load_config
    from tests.kubelet_volume import AtomicWriter

    manifests = render(set_values=EXTRA_CONFIGMAPS)
    own = one(manifests, "ConfigMap", "transaction-webhook-bridge-config")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "team").write_text("secret-of-the-teams\n")
    (example,) = yaml.safe_load_all((REPO / "deploy" / "helm" / "secret.example.yaml").read_text())
    for key, value in example["stringData"].items():
        (secrets / key).write_text(value + "\n")

    def team(name: str) -> str:
        hook = {
            "id": f"{name}-1",
            "account": f"acct_{name}",
            "url": f"https://{name}.example/hook",
            "events": ["transaction.success"],
            "secret_file": f"{SECRETS_DIR}/team",
        }
        return yaml.safe_dump({"webhooks": [hook]})

    payload = {
        **own["data"],
        "team-b.yml": team("team-b"),  # one key of ConfigMap team-b-webhooks
        "team-a.yaml": team("team-a"),  # one key of ConfigMap team-a-webhooks
    }
    volume = tmp_path / "etc-bridge"
    AtomicWriter(volume).write(
        {
            key: text.replace(SECRETS_DIR, str(secrets)).replace(
                IMAGE_SCHEMAS_DIR, str(REPO / "schemas")
            )
            for key, text in payload.items()
        }
    )
    (container, _volume) = config_volume(manifests)
    assert container["args"][2] == "/etc/bridge"  # the mount path: here, ``volume``

    config = load_config(volume, {})

    assert [w.id for w in config.webhooks] == ["shop-main", "shop-alerts", "team-a-1", "team-b-1"]
    assert config.topics.partitions == 6, "the other sections come from config.bridge"


def test_kafka_settings_roll_the_pods_but_the_bridge_configuration_does_not() -> None:
    def annotations(**settings: str) -> dict[str, str]:
        deployment = one(render(set_values=settings), "Deployment")
        result: dict[str, str] = deployment["spec"]["template"]["metadata"]["annotations"]
        return result

    default = annotations()
    assert annotations(**{"kafka.bootstrapServers": "other:9092"}) != default
    assert annotations(**{"config.bridge.logging.level": "debug"}) == default


# ---- PrometheusRule: deploy/prometheus/alerts.yaml, one source --------------------------------


def test_prometheus_rule_equals_alerts_yaml() -> None:
    rule = one(render(set_values={"prometheusRule.enabled": "true"}), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    link = CHART / "files" / "alerts.yaml"
    assert link.is_symlink() and link.resolve() == ALERTS.resolve()


# ---- NetworkPolicy -----------------------------------------------------------------------------


def egress_rule(policy: dict[str, Any], port: int, protocol: str = "TCP") -> dict[str, Any]:
    (rule,) = [r for r in policy["egress"] if {"port": port, "protocol": protocol} in r["ports"]]
    result: dict[str, Any] = rule
    return result


def test_network_policy_opens_exactly_dns_kafka_registry_and_public_https() -> None:
    policy = one(render(PRODUCTION_VALUES), "NetworkPolicy")["spec"]
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert policy["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]
    for rule in policy["egress"]:
        assert rule.get("to") and rule.get("ports"), f"rule open to any address or port: {rule}"
    opened = sorted((p["port"], p["protocol"]) for r in policy["egress"] for p in r["ports"])
    assert opened == sorted(
        [(53, "UDP"), (53, "TCP"), (9092, "TCP"), (9093, "TCP"), (8081, "TCP"), (443, "TCP")]
    )
    assert egress_rule(policy, 53, "UDP")["to"] == [KUBE_DNS_PEER]
    assert egress_rule(policy, 9092)["to"] == [{"ipBlock": {"cidr": "10.42.16.0/24"}}]
    assert egress_rule(policy, 8081)["to"] == [{"ipBlock": {"cidr": "10.42.17.0/28"}}]
    ipv4 = next(
        p["ipBlock"] for p in egress_rule(policy, 443)["to"] if p["ipBlock"]["cidr"] == "0.0.0.0/0"
    )
    excluded = [ipaddress.ip_network(cidr) for cidr in ipv4["except"]]
    for private in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"):
        assert any(ipaddress.ip_network(private).subnet_of(net) for net in excluded), private


def test_network_policy_uses_the_given_ranges_and_defaults_to_placeholders() -> None:
    policy = one(
        render(
            set_values={
                "networkPolicy.kafka.cidrs": "{10.1.0.0/24,10.2.0.0/24}",
                "networkPolicy.registry.cidrs": "{10.3.0.0/28}",
                "networkPolicy.registry.port": "8443",
            }
        ),
        "NetworkPolicy",
    )["spec"]
    assert egress_rule(policy, 9092)["to"] == [
        {"ipBlock": {"cidr": "10.1.0.0/24"}},
        {"ipBlock": {"cidr": "10.2.0.0/24"}},
    ]
    assert egress_rule(policy, 8443)["to"] == [{"ipBlock": {"cidr": "10.3.0.0/28"}}]
    default = one(render(), "NetworkPolicy")["spec"]
    for port in (9092, 8081):
        for peer in egress_rule(default, port)["to"]:
            assert ipaddress.ip_network(peer["ipBlock"]["cidr"]).subnet_of(PLACEHOLDER)


def test_production_brokers_match_the_network_policy_ports() -> None:
    manifests = render(PRODUCTION_VALUES)
    brokers = one(manifests, "ConfigMap", "transaction-webhook-bridge-kafka")["data"][
        "KAFKA_BOOTSTRAP_SERVERS"
    ]
    kafka = egress_rule(one(manifests, "NetworkPolicy")["spec"], 9092)
    for broker in brokers.split(","):
        assert {"port": int(broker.rpartition(":")[2]), "protocol": "TCP"} in kafka["ports"]
    for peer in kafka["to"]:
        assert not ipaddress.ip_network(peer["ipBlock"]["cidr"]).overlaps(PLACEHOLDER)
