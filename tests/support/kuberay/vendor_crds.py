"""Regenerate ``ray.io_v1.schema.json`` from KubeRay's CRDs (run by hand when KubeRay is upgraded).

    python tests/support/kuberay/vendor_crds.py /path/to/kuberay/checkout v1.7.0

Reads ``ray-operator/config/crd/bases/ray.io_rayclusters.yaml`` and ``ray.io_rayjobs.yaml``
at the given git ref, takes the ``v1`` version's ``openAPIV3Schema`` of each, drops the
``description`` texts (most of the 2.3 MB), and stores every subtree that occurs more
than once (the Kubernetes PodTemplateSpec appears five times) once under ``$defs``,
referenced by ``$ref``. Nothing else changes: every type, ``required`` list, enum,
pattern and ``x-kubernetes-*`` marker is kept as KubeRay generated it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

CRDS = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
SHARED_MINIMUM = 1500
"""Subtrees whose JSON is at least this long and that occur twice or more are shared."""
OUTPUT = Path(__file__).with_name("ray.io_v1.schema.json")


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _strip(value) for key, value in node.items() if key != "description"}
    if isinstance(node, list):
        return [_strip(value) for value in node]
    return node


def _text(node: Any) -> str:
    return json.dumps(node, sort_keys=True, separators=(",", ":"))


def _count(node: Any, name: str, seen: dict[str, tuple[int, str]]) -> None:
    """Count every large subtree, remembering the key it was first found under (to name it)."""
    if isinstance(node, dict):
        if "$ref" not in node:
            text = _text(node)
            if len(text) >= SHARED_MINIMUM:
                times, first = seen.get(text, (0, name))
                seen[text] = (times + 1, first)
        for key, value in node.items():
            _count(value, key, seen)
    elif isinstance(node, list):
        for value in node:
            _count(value, name, seen)


def _replace(node: Any, text: str, reference: dict[str, str]) -> Any:
    if isinstance(node, dict):
        if _text(node) == text:
            return dict(reference)
        return {key: _replace(value, text, reference) for key, value in node.items()}
    if isinstance(node, list):
        return [_replace(value, text, reference) for value in node]
    return node


def _share(roots: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Replace repeated subtrees by ``$ref`` to ``$defs``, largest first."""
    definitions: dict[str, Any] = {}
    while True:
        seen: dict[str, tuple[int, str]] = {}
        for root in (*roots.values(), *definitions.values()):
            _count(root, "root", seen)
        repeated = [(len(text), text, first) for text, (times, first) in seen.items() if times > 1]
        if not repeated:
            return roots, definitions
        _, text, first = max(repeated)
        name = f"{first}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
        reference = {"$ref": f"#/$defs/{name}"}
        roots = {kind: _replace(root, text, reference) for kind, root in roots.items()}
        definitions = {key: _replace(value, text, reference) for key, value in definitions.items()}
        definitions[name] = json.loads(text)


def main(checkout: str, ref: str) -> None:
    commit = subprocess.run(["git", "-C", checkout, "rev-parse", f"{ref}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    roots = {}
    for kind, name in CRDS.items():
        text = subprocess.run(["git", "-C", checkout, "show", f"{commit}:ray-operator/config/crd/bases/{name}"],
                              check=True, capture_output=True, text=True).stdout
        crd = yaml.safe_load(text)
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        roots[kind] = _strip(version["schema"]["openAPIV3Schema"])
    roots, definitions = _share(roots)
    document = {
        "source": {"repository": "https://github.com/ray-project/kuberay", "ref": ref, "commit": commit,
                   "files": {kind: f"ray-operator/config/crd/bases/{name}" for kind, name in CRDS.items()}},
        "kinds": roots,
        "$defs": definitions,
    }
    OUTPUT.write_text(json.dumps(document, sort_keys=True, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
