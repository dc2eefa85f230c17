"""A small Kustomize renderer for the tests: exactly the features ``deploy/k8s`` uses, offline.

Supported: ``resources`` (files and directories), ``namespace``, ``configMapGenerator`` (files,
literals, ``behavior: merge``) with name hashes disabled, ``patches`` (strategic merge of built-in
kinds, JSON merge of custom resources, JSON 6902), ``images`` and ``replacements`` (scalar values,
selected by kind and name, dotted field paths with list indexes), and the dropping of
``config.kubernetes.io/local-config`` objects from the output. Any other key or option raises
:class:`Unsupported`, so a kustomization never renders silently wrong. A test compares the result
with ``kubectl kustomize`` where kubectl is installed.

The order is kustomize's (v5): each kustomization accumulates its resources (a directory is built
completely, its own replacements included), runs its generators (a ``behavior: merge`` updates the
accumulated ConfigMap), then its transformers (patches, namespace, images, replacements last).
Local-config objects stay available to every level's replacements and are dropped only from the
final output. Hence an overlay's merged value reaches a field only through a replacement in that
overlay: the base's replacements ran with the base's value.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

Manifest = dict[str, Any]

SUPPORTED_KEYS = frozenset(
    {
        "apiVersion",
        "kind",
        "resources",
        "namespace",
        "generatorOptions",
        "configMapGenerator",
        "patches",
        "images",
        "replacements",
    }
)
# Cluster-scoped kinds among those the manifests use; everything else gets the namespace.
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding"})
# Built-in API groups: patches on their kinds are strategic merges, on others JSON merges.
BUILTIN_GROUPS = frozenset({"", "apps", "batch", "policy", "networking.k8s.io", "autoscaling"})
# Objects kustomize reads but never prints (unless the value is "false").
LOCAL_CONFIG_ANNOTATION = "config.kubernetes.io/local-config"
# What a replacement's source and target selectors may name.
SELECTOR_KEYS = frozenset({"group", "version", "kind", "name", "namespace"})


class Unsupported(Exception):
    """The kustomization uses a feature this renderer does not implement."""


def render(directory: Path, *, include_local_config: bool = False) -> list[Manifest]:
    """The manifests ``kubectl kustomize directory`` would print, in no particular order.

    ``include_local_config`` keeps the local-config objects (as kustomize does inside a build)."""
    manifests = build(directory)
    if include_local_config:
        return manifests
    return [m for m in manifests if not is_local_config(m)]


def is_local_config(manifest: Manifest) -> bool:
    """Whether kustomize leaves this object out of its output (annotation present, not "false")."""
    annotations: dict[str, str] = manifest["metadata"].get("annotations") or {}
    return annotations.get(LOCAL_CONFIG_ANNOTATION, "false") != "false"


def build(directory: Path) -> list[Manifest]:
    """One kustomization's accumulated manifests, local-config objects included."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED_KEYS
    if unknown:
        raise Unsupported(f"{directory}: kustomization keys {sorted(unknown)}")
    manifests: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        manifests += build(path) if path.is_dir() else load_documents(path)
    hashing = not kustomization.get("generatorOptions", {}).get("disableNameSuffixHash", False)
    for generator in kustomization.get("configMapGenerator", []):
        apply_generator(manifests, directory, generator, hashing)
    for patch in kustomization.get("patches", []):
        apply_patch(manifests, directory, patch)
    for image in kustomization.get("images", []):
        for container in containers(manifests):
            set_image(container, image)
    if "namespace" in kustomization:
        for manifest in manifests:
            if manifest["kind"] not in CLUSTER_SCOPED:
                manifest["metadata"]["namespace"] = kustomization["namespace"]
    # Kustomize's last built-in transformer: after this kustomization's generators and patches.
    for replacement in kustomization.get("replacements", []):
        apply_replacement(manifests, replacement)
    return manifests


def load_documents(path: Path) -> list[Manifest]:
    """The non-empty YAML documents of a file."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


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


def apply_generator(
    manifests: list[Manifest], directory: Path, generator: dict[str, Any], hashing: bool
) -> None:
    unknown = set(generator) - {"name", "files", "literals", "behavior", "options"}
    if unknown:
        raise Unsupported(f"configMapGenerator keys {sorted(unknown)}")
    if set(generator.get("options", {})) - {"disableNameSuffixHash"}:
        raise Unsupported(f"configMapGenerator options {sorted(generator['options'])}")
    data: dict[str, str] = {}
    for entry in generator.get("files", []):
        key, _, file = entry.rpartition("=")
        data[key or Path(file).name] = (directory / file).read_text()
    for literal in generator.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    behavior = generator.get("behavior", "create")
    if behavior == "create":
        # A merge keeps the name the base generated; a new ConfigMap would get a hash suffix.
        if hashing and not generator.get("options", {}).get("disableNameSuffixHash", False):
            raise Unsupported(f"ConfigMap {generator['name']}: name-suffix hashes")
        manifests.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": generator["name"]},
                "data": data,
            }
        )
    elif behavior == "merge":
        one(manifests, "ConfigMap", generator["name"]).setdefault("data", {}).update(data)
    else:
        raise Unsupported(f"configMapGenerator behavior {behavior}")


def apply_patch(manifests: list[Manifest], directory: Path, entry: dict[str, Any]) -> None:
    if set(entry) - {"path", "target"}:
        raise Unsupported(f"patch keys {sorted(entry)}")
    body = yaml.safe_load((directory / entry["path"]).read_text())
    if isinstance(body, list):
        for manifest in [m for m in manifests if matches(m, entry["target"])]:
            for operation in body:
                json6902(manifest, operation)
        return
    target = {"kind": body["kind"], "name": body["metadata"]["name"]}
    matched = [m for m in manifests if matches(m, entry.get("target", target))]
    if not matched:
        raise AssertionError(f"patch {entry['path']} matches no resource")
    for manifest in matched:
        merged = merge(manifest, body, strategic=group_of(manifest) in BUILTIN_GROUPS)
        manifest.clear()
        manifest.update(merged)


def group_of(manifest: Manifest) -> str:
    api_version: str = manifest["apiVersion"]
    return api_version.rpartition("/")[0]


def matches(manifest: Manifest, target: dict[str, str]) -> bool:
    unknown = set(target) - {"group", "version", "kind", "name"}
    if unknown:
        raise Unsupported(f"patch target keys {sorted(unknown)}")
    actual = {
        "group": group_of(manifest),
        "version": manifest["apiVersion"].rpartition("/")[2],
        "kind": manifest["kind"],
        "name": manifest["metadata"]["name"],
    }
    return all(actual[key] == value for key, value in target.items())


def merge(base: Any, patch: Any, strategic: bool) -> Any:
    """A merge patch: maps merge, null deletes; in strategic mode lists of named items merge."""
    if isinstance(base, dict) and isinstance(patch, dict):
        result = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                result.pop(key, None)
            else:
                result[key] = merge(base.get(key), value, strategic)
        return result
    if strategic and named_items(base) and named_items(patch):
        items: list[Any] = copy.deepcopy(base)
        for item in patch:
            same = [i for i, old in enumerate(items) if old["name"] == item["name"]]
            if same:
                items[same[0]] = merge(items[same[0]], item, strategic)
            else:
                items.append(copy.deepcopy(item))
        return items
    return copy.deepcopy(patch)


def named_items(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, dict) and "name" in item for item in value
    )


def json6902(manifest: Manifest, operation: dict[str, Any]) -> None:
    """Apply one JSON 6902 ``add``, ``replace`` or ``remove`` operation in place."""
    *parents, last = [
        part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]
    ]
    node: Any = manifest
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    op = operation["op"]
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if op == "add":
            node.insert(index, operation["value"])
        elif op == "replace":
            node[index] = operation["value"]
        elif op == "remove":
            del node[index]
        else:
            raise Unsupported(f"JSON 6902 op {op}")
    elif op in ("add", "replace"):
        if op == "replace" and last not in node:
            raise AssertionError(f"replace of missing {operation['path']}")
        node[last] = operation["value"]
    elif op == "remove":
        del node[last]
    else:
        raise Unsupported(f"JSON 6902 op {op}")


def set_image(container: dict[str, Any], image: dict[str, str]) -> None:
    """The ``images`` transformer (``newName``, ``newTag``) for one container."""
    reference: str = container["image"]
    if "@" in reference or set(image) - {"name", "newName", "newTag"}:
        raise Unsupported(f"image digests ({reference}, {image})")
    name, tag = reference, ""
    if reference.rfind(":") > reference.rfind("/"):
        name, _, tag = reference.rpartition(":")
    if name == image["name"]:
        tag = image.get("newTag", tag)
        container["image"] = image.get("newName", name) + (f":{tag}" if tag else "")


def apply_replacement(manifests: list[Manifest], replacement: dict[str, Any]) -> None:
    """One ``replacements`` entry: copy a scalar from one object into fields of others.

    A missing source or target field is an error, as in kustomize v5. Stricter than kustomize, which
    skips it silently, so is a target selecting no object (a typo would leave a placeholder)."""
    if set(replacement) != {"source", "targets"}:
        raise Unsupported(f"replacement keys {sorted(replacement)}: only inline source, targets")
    source = replacement["source"]
    unknown = set(source) - SELECTOR_KEYS - {"fieldPath"}
    if unknown:
        raise Unsupported(f"replacement source keys {sorted(unknown)}")
    if "fieldPath" not in source:
        raise Unsupported("replacement source without fieldPath (default metadata.name)")
    selector = {key: value for key, value in source.items() if key != "fieldPath"}
    found = [m for m in manifests if selected(m, selector)]
    if len(found) != 1:
        raise ValueError(f"replacement source {selector} selects {len(found)} objects, not one")
    value = lookup(found[0], source["fieldPath"])
    if value is None:
        raise ValueError(f"replacement source field {source['fieldPath']} is missing")
    if isinstance(value, dict | list):
        raise Unsupported(f"replacement of a non-scalar value ({source['fieldPath']})")
    for target in replacement["targets"]:
        unknown = set(target) - {"select", "fieldPaths"}
        if unknown:
            raise Unsupported(f"replacement target keys {sorted(unknown)}")
        if not target.get("fieldPaths"):
            raise Unsupported("replacement target without fieldPaths (default metadata.name)")
        if set(target["select"]) - SELECTOR_KEYS:
            raise Unsupported(f"replacement select keys {sorted(target['select'])}")
        matched = [m for m in manifests if selected(m, target["select"])]
        if not matched:
            raise ValueError(f"replacement target {target['select']} selects nothing")
        for manifest in matched:
            for field_path in target["fieldPaths"]:
                set_scalar(manifest, field_path, value)


def selected(manifest: Manifest, selector: dict[str, str]) -> bool:
    """Whether a replacement selector (exact group, version, kind, name, namespace) selects it."""
    group, _, version = manifest["apiVersion"].rpartition("/")
    actual = {
        "group": group,
        "version": version,
        "kind": manifest["kind"],
        "name": manifest["metadata"]["name"],
        "namespace": manifest["metadata"].get("namespace", ""),
    }
    return all(actual[key] == value for key, value in selector.items())


def path_parts(field_path: str) -> list[str]:
    """A dotted field path's parts; kustomize's ``[key=value]`` and ``*`` parts are unsupported."""
    parts = field_path.split(".")
    if any(not part or part.startswith("[") or "*" in part for part in parts):
        raise Unsupported(f"field path {field_path!r}: only names and list indexes")
    return parts


def step(node: Any, part: str, field_path: str) -> Any:
    """The child ``part`` of ``node`` (an index for a list), or None when it is absent."""
    if part.isdigit():
        if not isinstance(node, list):
            raise ValueError(f"{field_path}: index {part} into a {type(node).__name__}")
        return node[int(part)] if int(part) < len(node) else None
    if not isinstance(node, dict):
        raise ValueError(f"{field_path}: field {part} of a {type(node).__name__}")
    return node.get(part)


def lookup(manifest: Manifest, field_path: str) -> Any:
    """The value at a dotted field path, or None when any part is absent."""
    node: Any = manifest
    for part in path_parts(field_path):
        node = step(node, part, field_path)
        if node is None:
            return None
    return node


def set_scalar(manifest: Manifest, field_path: str, value: str | int | float | bool) -> None:
    """Set an existing scalar field to ``value`` keeping the field's type, as kustomize does (it
    copies the text and keeps the YAML tag): "8081" into an integer field lands as 8081."""
    *parents, last = path_parts(field_path)
    node: Any = manifest
    for part in parents:
        node = step(node, part, field_path)
        if node is None:
            raise ValueError(f"replacement target field {field_path} is missing")
    old = step(node, last, field_path)
    if old is None:
        raise ValueError(f"replacement target field {field_path} is missing")
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if isinstance(old, str):
        new: Any = text
    elif isinstance(old, int) and not isinstance(old, bool):
        if not re.fullmatch(r"[-+]?[0-9]+", text):
            raise ValueError(f"{field_path}: {text!r} into an integer field")
        new = int(text)
    else:
        raise Unsupported(f"{field_path}: replacing a {type(old).__name__} value")
    if isinstance(node, list):
        node[int(last)] = new
    else:
        node[last] = new
