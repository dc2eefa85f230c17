"""A small Kustomize renderer for the tests: exactly the features ``deploy/k8s`` uses, offline.

Supported: ``resources`` (files and directories), ``namespace``, ``configMapGenerator`` (files,
literals, ``behavior: merge``) with name hashes disabled, ``patches`` (strategic merge of built-in
kinds, JSON merge of custom resources, JSON 6902) and ``images``. Any other key raises
:class:`Unsupported`, so a kustomization never renders silently wrong. A test compares the result
with ``kubectl kustomize`` where kubectl is installed.
"""

from __future__ import annotations

import copy
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
    }
)
# Cluster-scoped kinds among those the manifests use; everything else gets the namespace.
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding"})
# Built-in API groups: patches on their kinds are strategic merges, on others JSON merges.
BUILTIN_GROUPS = frozenset({"", "apps", "batch", "policy", "networking.k8s.io", "autoscaling"})


class Unsupported(Exception):
    """The kustomization uses a feature this renderer does not implement."""


def render(directory: Path) -> list[Manifest]:
    """The manifests ``kubectl kustomize directory`` would print, in no particular order."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED_KEYS
    if unknown:
        raise Unsupported(f"{directory}: kustomization keys {sorted(unknown)}")
    manifests: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        manifests += render(path) if path.is_dir() else load_documents(path)
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
        result = copy.deepcopy(base)
        for item in patch:
            same = [i for i, old in enumerate(result) if old["name"] == item["name"]]
            if same:
                result[same[0]] = merge(result[same[0]], item, strategic)
            else:
                result.append(copy.deepcopy(item))
        return result
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
