"""The deployment files are valid for the tools that read them, and everything they name exists.

* ``deployments/ray-up/*.yaml`` against Ray's own cluster-config schema (the
  ``ray-schema.json`` Ray ships), then through the preparation and checks ``ray up``
  makes before it touches a machine.
* ``deployments/kuberay/*.yaml`` against the ``openAPIV3Schema`` of KubeRay's ``ray.io/v1``
  CRDs (vendored from KubeRay v1.7.0 in tests/support/kuberay, descriptions dropped and
  repeated subtrees shared; see vendor_crds.py), with unknown fields refused as
  ``kubectl apply --validate=strict`` does, and against the rules KubeRay's operator
  enforces in ``ray-operator/controllers/ray/utils/validation.go`` (transcribed below).
* Every ``python -m rayfleet.jobs.<name>`` they (and the README and docs/) name is a job module,
  with options the job has and files that exist where the job will look for them.
"""

from __future__ import annotations

import copy
import importlib
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from rayfleet.ledger._location import LedgerLocation
from rayfleet.roster import load_roster

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENTS = ROOT / "deployments"
RAY_UP = sorted((DEPLOYMENTS / "ray-up").glob("*.yaml"))
KUBERAY = sorted((DEPLOYMENTS / "kuberay").glob("*.yaml"))
CRD_SCHEMAS = ROOT / "tests" / "support" / "kuberay" / "ray.io_v1.schema.json"
RAY_SCHEMA = json.loads((Path(ray.autoscaler.__file__).with_name("ray-schema.json")).read_text())
PROJECT_VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)  # type: ignore[union-attr]


def _ids(paths: list[Path]) -> list[str]:
    return [str(path.relative_to(DEPLOYMENTS)) for path in paths]


def test_the_deployment_folders_hold_what_the_docs_promise() -> None:
    assert {path.name for path in RAY_UP} >= {"local-cluster.yaml", "aws-cluster.yaml"}
    kinds = {(doc["apiVersion"], doc["kind"]) for _, doc in _kuberay_documents()}
    assert {("ray.io/v1", "RayCluster"), ("ray.io/v1", "RayJob")} <= kinds


# -- ray up ---------------------------------------------------------------------------

def _ray_up(path: Path) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    return config


@pytest.mark.parametrize("path", RAY_UP, ids=_ids(RAY_UP))
def test_ray_up_config_matches_rays_cluster_config_schema(path: Path) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(RAY_SCHEMA).iter_errors(_ray_up(path))]
    assert errors == []


@pytest.mark.parametrize("path", RAY_UP, ids=_ids(RAY_UP))
def test_ray_up_config_passes_the_checks_ray_up_makes_before_touching_a_machine(path: Path) -> None:
    prepared = prepare_config(copy.deepcopy(_ray_up(path)))  # provider defaults merged, node types filled
    validate_config(prepared)
    workers = [name for name in prepared["available_node_types"] if name != prepared["head_node_type"]]
    if path.name == "local-cluster.yaml":
        # The local provider runs one node type on every listed machine; workers are the other IPs.
        assert prepared["provider"]["worker_ips"] and prepared["provider"]["head_ip"]
        assert prepared["available_node_types"]["local.cluster.node"]["max_workers"] == len(
            prepared["provider"]["worker_ips"])
    else:
        assert workers and all(prepared["available_node_types"][name]["min_workers"] >= 1 for name in workers)


def _start_environment(command: str) -> dict[str, str]:
    """The ``NAME=value`` assignments a start command puts in front of ``ray start``."""
    words = shlex.split(command.replace("&&", " && "))
    start = next(index for index in range(len(words) - 1) if words[index:index + 2] == ["ray", "start"])
    return dict(word.split("=", 1) for word in words[:start] if re.fullmatch(r"[A-Z_]+=.*", word))


@pytest.mark.parametrize("path", RAY_UP, ids=_ids(RAY_UP))
def test_ray_up_starts_a_head_and_workers_with_token_auth_and_the_fleets_storage(path: Path) -> None:
    config = _ray_up(path)
    head = " ".join(config["head_start_ray_commands"])
    worker = " ".join(config["worker_start_ray_commands"])
    assert "ray start --head" in head and "ray start --address=$RAY_HEAD_IP:6379" in worker
    head_env, worker_env = _start_environment(head), _start_environment(worker)
    # Token auth on every node (Ray 2.60), with the token ray get-auth-token wrote, copied to each node.
    assert head_env["RAY_AUTH_MODE"] == worker_env["RAY_AUTH_MODE"] == "token"
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    # One fleet: every node names the same storage, and it is shared (object storage or a shared mount).
    storage = head_env["RAYFLEET_STORAGE"]
    assert storage == worker_env["RAYFLEET_STORAGE"]
    assert storage.startswith(("s3://", "/mnt/")), storage
    text = path.read_text()
    if storage.startswith("s3://"):
        # A cloud cluster: its ledger is PostgreSQL, whose URL (with a password) comes from a file on
        # the operator's machine, copied to every node and sourced by the start commands.
        sourced = {word for command in (head, worker) for word in re.findall(r"\. (\S+) &&", command)}
        assert sourced and all(config["file_mounts"][target].startswith("~/") for target in sourced)
        urls = re.findall(r"RAYFLEET_LEDGER=(\S+?)\"?\s", text)
        assert urls and all(LedgerLocation.parse(url).kind == "postgresql" for url in urls), urls
    else:
        ledger = LedgerLocation.parse(head_env["RAYFLEET_LEDGER"])
        # SQLite must never sit on a network folder.
        assert ledger.kind == "sqlite" and not ledger.url.removeprefix("sqlite://").startswith(storage)


@pytest.mark.parametrize("path", RAY_UP, ids=_ids(RAY_UP))
def test_ray_up_installs_this_checkout_it_copies_to_the_nodes(path: Path) -> None:
    config = _ray_up(path)
    local = {target: source for target, source in config["file_mounts"].items() if not source.startswith("~")}
    for source in local.values():
        assert (ROOT / source).exists(), f"{path.name} mounts {source!r}, missing from the repository root"
    [checkout] = [target for target, source in local.items() if (ROOT / source / "pyproject.toml").is_file()]
    assert any("pip install" in command and checkout in command for command in config["setup_commands"])


def test_rays_schema_refuses_a_misspelt_ray_up_key() -> None:
    config = _ray_up(DEPLOYMENTS / "ray-up" / "local-cluster.yaml")
    config["head_start_ray_command"] = config.pop("head_start_ray_commands")
    with pytest.raises(jsonschema.ValidationError, match="head_start_ray_command"):
        jsonschema.validate(config, RAY_SCHEMA)


# -- KubeRay --------------------------------------------------------------------------

def _kuberay_documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in KUBERAY for doc in yaml.safe_load_all(path.read_text()) if doc]


def _ray_objects() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path, doc in _kuberay_documents() if doc["apiVersion"] == "ray.io/v1"]


RAY_OBJECTS = _ray_objects()
RAY_OBJECT_IDS = [f"{path.name}:{doc['kind']}" for path, doc in RAY_OBJECTS]


def _strict(node: Any) -> Any:
    """Refuse unknown fields where the CRD lists the fields, as the API server's strict validation does."""
    if isinstance(node, dict):
        strict = {key: _strict(value) for key, value in node.items()}
        if ("properties" in strict and "additionalProperties" not in strict
                and not strict.get("x-kubernetes-preserve-unknown-fields")):
            strict["additionalProperties"] = False
        return strict
    if isinstance(node, list):
        return [_strict(value) for value in node]
    return node


def _crd_validator(kind: str) -> jsonschema.Draft202012Validator:
    vendored = json.loads(CRD_SCHEMAS.read_text())
    schema = {**_strict(vendored["kinds"][kind]), "$defs": _strict(vendored["$defs"])}
    return jsonschema.Draft202012Validator(schema)


def _crd_errors(doc: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _crd_validator(doc["kind"]).iter_errors(doc)]


DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _cluster_rules(spec: dict[str, Any], where: str) -> Iterator[str]:
    """``ValidateRayClusterSpec`` of KubeRay's operator, for the fields these manifests use, plus image rules."""
    if not spec.get("rayVersion"):
        yield f"{where}: rayVersion is not set (KubeRay needs it, e.g. for token auth)"
    groups = [("head", spec["headGroupSpec"])] + [(g.get("groupName", "?"), g) for g in spec.get("workerGroupSpecs", [])]
    if len(groups) < 2:
        yield f"{where}: no worker group: hosts on other nodes are what survives a node loss"
    images = set()
    autoscaling = bool(spec.get("enableInTreeAutoscaling"))
    for name, group in groups:
        params = group.get("rayStartParams", {})
        for key, value in params.items():
            if not isinstance(value, str):
                yield f"{where}: {name} rayStartParams[{key!r}] is {value!r}; every rayStartParams value is a string"
        if "labels" in params:
            yield f"{where}: {name} rayStartParams['labels'] is not supported; use the group's labels field"
        if any(params.get(key) for key in RESOURCE_PARAMS) and group.get("resources"):
            yield f"{where}: {name} sets resources in both rayStartParams and resources"
        containers = group["template"]["spec"].get("containers", [])
        if not containers:
            yield f"{where}: {name} group has no container"
        for container in containers:
            image = container.get("image", "")
            tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
            if not tag or tag == "latest":
                yield f"{where}: {name} container {container.get('name')!r} image {image!r} needs a pinned tag"
            images.add(image)
        if name != "head":
            low, high = group.get("minReplicas"), group.get("maxReplicas")
            if not autoscaling and (low is None or high is None):
                yield f"{where}: worker group {name} must set minReplicas and maxReplicas when autoscaling is off"
            elif low is not None and high is not None:
                if low < 0 or high < 0 or low > high:
                    yield f"{where}: worker group {name} has minReplicas {low} / maxReplicas {high}"
                if not low <= group.get("replicas", low) <= high:
                    yield f"{where}: worker group {name} replicas {group['replicas']} outside [{low}, {high}]"
    if len(images) > 1:
        yield f"{where}: head and workers run different images {sorted(images)}; Ray needs one version on all nodes"
    auth = spec.get("authOptions", {})
    if auth.get("mode") == "token" and _version(spec.get("rayVersion", "0")) < (2, 52, 0):
        yield f"{where}: authOptions.mode token needs rayVersion >= 2.52.0"


def kuberay_rule_violations(doc: dict[str, Any]) -> list[str]:
    """What KubeRay's operator (``ValidateRay*Metadata``/``ValidateRay*Spec``) would refuse, and our own rules."""
    problems = []
    name = doc.get("metadata", {}).get("name", "")
    longest = 53 if doc["kind"] == "RayCluster" else 47
    if not DNS1035.fullmatch(name) or len(name) > longest:
        problems.append(f"metadata.name {name!r} must be a DNS-1035 label of at most {longest} characters")
    spec = doc.get("spec", {})
    if doc["kind"] == "RayCluster":
        return problems + list(_cluster_rules(spec, "spec"))
    if not spec.get("entrypoint", "").strip():
        problems.append("spec.entrypoint is empty: a RayJob runs its entrypoint")
    selector = spec.get("clusterSelector")
    cluster = spec.get("rayClusterSpec")
    shutdown = spec.get("shutdownAfterJobFinishes", False)
    ttl = spec.get("ttlSecondsAfterFinished", 0)
    if ttl < 0:
        problems.append("spec.ttlSecondsAfterFinished must be non-negative")
    if not shutdown and ttl > 0:
        problems.append("spec.ttlSecondsAfterFinished needs shutdownAfterJobFinishes: true")
    if spec.get("suspend") and not shutdown:
        problems.append("a suspended RayJob needs shutdownAfterJobFinishes: true")
    if (cluster is None) == (not selector):
        problems.append("exactly one of spec.rayClusterSpec and spec.clusterSelector must be set")
    if selector:
        if not selector.get("ray.io/cluster"):
            problems.append("spec.clusterSelector needs a non-empty 'ray.io/cluster'")
        if spec.get("backoffLimit", 0) > 0 or spec.get("suspend"):
            problems.append("spec.clusterSelector forbids backoffLimit > 0 and suspend")
    if cluster is not None:
        problems += list(_cluster_rules(cluster, "spec.rayClusterSpec"))
        # Ours: a cluster made for one job is deleted after it, and not at once, so its logs can be read.
        if not shutdown or ttl <= 0:
            problems.append("a RayJob with its own cluster sets shutdownAfterJobFinishes: true and a "
                            "ttlSecondsAfterFinished > 0")
    for field in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if field in spec and spec[field] <= 0:
            problems.append(f"spec.{field} must be a positive integer")
    if "runtimeEnvYAML" in spec and not isinstance(yaml.safe_load(spec["runtimeEnvYAML"]), dict):
        problems.append("spec.runtimeEnvYAML must be a YAML mapping")
    return problems


@pytest.mark.parametrize(("path", "doc"), RAY_OBJECTS, ids=RAY_OBJECT_IDS)
def test_kuberay_manifest_matches_the_crd_schema(path: Path, doc: dict[str, Any]) -> None:
    assert _crd_errors(doc) == []


@pytest.mark.parametrize(("path", "doc"), RAY_OBJECTS, ids=RAY_OBJECT_IDS)
def test_kuberay_manifest_follows_the_operators_rules(path: Path, doc: dict[str, Any]) -> None:
    assert kuberay_rule_violations(doc) == []


def _manifest(kind: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(next(doc for _, doc in RAY_OBJECTS if doc["kind"] == kind and doc["metadata"]["name"] == name))


def test_the_crd_schema_and_the_rules_refuse_what_kuberay_refuses() -> None:
    cluster = _manifest("RayCluster", "rayfleet")
    cluster["spec"]["workerGroupSpecs"][0]["rayStartParams"] = {"num-cpus": 2}
    assert any("rayStartParams/num-cpus" in error and "string" in error for error in _crd_errors(cluster))
    cluster = _manifest("RayCluster", "rayfleet")
    del cluster["spec"]["headGroupSpec"]
    assert any("'headGroupSpec' is a required property" in error for error in _crd_errors(cluster))
    job = _manifest("RayJob", "rayfleet-demo")
    job["spec"]["shutdownAfterJobFinish"] = job["spec"].pop("shutdownAfterJobFinishes")
    assert any("shutdownAfterJobFinish" in error for error in _crd_errors(job))
    job = _manifest("RayJob", "rayfleet-demo")
    job["spec"]["shutdownAfterJobFinishes"] = False
    assert "spec.ttlSecondsAfterFinished needs shutdownAfterJobFinishes: true" in kuberay_rule_violations(job)
    job = _manifest("RayJob", "rayfleet-demo")
    group = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    group["minReplicas"], group["template"]["spec"]["containers"][0]["image"] = 5, "rayproject/ray:latest"
    problems = "\n".join(kuberay_rule_violations(job))
    assert "minReplicas 5 / maxReplicas 4" in problems and "needs a pinned tag" in problems
    assert "different images" in problems
    job = _manifest("RayJob", "rayfleet-apply-team")
    job["spec"]["entrypoint"], job["metadata"]["name"] = " ", "Apply_Team"
    assert len(kuberay_rule_violations(job)) == 2


def _pod_specs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"].get("rayClusterSpec")
    if spec is None:
        return
    yield spec["headGroupSpec"]["template"]["spec"]
    for group in spec.get("workerGroupSpecs", []):
        yield group["template"]["spec"]


def _objects(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in _kuberay_documents() if doc["kind"] == kind}


@pytest.mark.parametrize(("path", "doc"), RAY_OBJECTS, ids=RAY_OBJECT_IDS)
def test_kuberay_state_lives_outside_the_pods_and_the_ledger_url_in_a_secret(path: Path, doc: dict[str, Any]) -> None:
    claims = _objects("PersistentVolumeClaim")
    text = path.read_text()
    for pod in _pod_specs(doc):
        volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
        for container in pod["containers"]:
            env = {item["name"]: item for item in container.get("env", [])}
            storage_name = next(name for name in ("RAYFLEET_STORAGE", "RAYFLEET_DEMO_STORAGE") if name in env)
            storage = env[storage_name]["value"]
            if not storage.startswith("s3://"):
                # A folder: it must be a shared (ReadWriteMany) volume mounted there, never pod-local disk.
                mount = next(m for m in container["volumeMounts"] if storage.startswith(m["mountPath"]))
                claim = claims[volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]]
                assert "ReadWriteMany" in claim["spec"]["accessModes"]
            ledger_name = storage_name.replace("STORAGE", "LEDGER")
            secret = env[ledger_name]["valueFrom"]["secretKeyRef"]
            # The file says how to create that secret, with a PostgreSQL URL under that key.
            created = re.search(rf"create secret generic {secret['name']}((?:\s*\\\n#\s+--from-literal=\S+)+)", text)
            assert created, f"{path.name} does not show how to create secret {secret['name']!r}"
            urls = dict(re.findall(r"--from-literal=([\w-]+)='?([^'\s]+)", created.group(1)))
            assert LedgerLocation.parse(urls[secret["key"]]).kind == "postgresql"


def test_kuberay_references_resolve() -> None:
    claims, config_maps, clusters = _objects("PersistentVolumeClaim"), _objects("ConfigMap"), _objects("RayCluster")
    for _, doc in RAY_OBJECTS:
        for pod in _pod_specs(doc):
            for volume in pod.get("volumes", []):
                if "persistentVolumeClaim" in volume:
                    assert volume["persistentVolumeClaim"]["claimName"] in claims
                if "configMap" in volume:
                    assert volume["configMap"]["name"] in config_maps
        selector = doc["spec"].get("clusterSelector") if doc["kind"] == "RayJob" else None
        if selector:
            assert selector["ray.io/cluster"] in clusters
    # The image is built from Ray's image of the version the manifests declare, with this project's version.
    dockerfile = (DEPLOYMENTS / "kuberay" / "Dockerfile").read_text()
    base = re.search(r"^FROM rayproject/ray:(\S+)", dockerfile, re.M).group(1)  # type: ignore[union-attr]
    for _, doc in RAY_OBJECTS:
        spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"].get("rayClusterSpec")
        if spec is not None:
            assert base.startswith(spec["rayVersion"] + "-")
            images = {c["image"] for pod in _pod_specs(doc) for c in pod["containers"]}
            assert images == {f"ghcr.io/your-org/rayfleet:{PROJECT_VERSION}"}
    # Every roster shipped in a ConfigMap loads, its agent classes included.
    for config_map in config_maps.values():
        for key, text in config_map["data"].items():
            if key.endswith((".yaml", ".yml")):
                assert load_roster(text)


# -- entrypoints ------------------------------------------------------------------------

ENTRYPOINT = re.compile(r"python -m (rayfleet\.jobs\.\w+)((?:[ \t]+(?!#)[^\s'\"`|;&]+)*)")


def _entrypoints() -> list[tuple[str, str, list[str]]]:
    found = []
    sources = [*sorted(DEPLOYMENTS.rglob("*")), ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for path in sources:
        if path.is_file() and path.suffix in (".yaml", ".yml", ".md", ""):
            for match in ENTRYPOINT.finditer(path.read_text()):
                found.append((str(path.relative_to(ROOT)), match.group(1), match.group(2).split()))
    return found


ENTRYPOINTS = _entrypoints()


def test_deployments_name_job_entrypoints() -> None:
    assert {module for _, module, _ in ENTRYPOINTS} >= {"rayfleet.jobs.demo", "rayfleet.jobs.apply"}


def _container_file(path: str) -> bool:
    """Whether a ConfigMap mounted in a KubeRay pod holds ``path`` (e.g. /home/ray/roster/team.yaml)."""
    config_maps = _objects("ConfigMap")
    for _, doc in RAY_OBJECTS:
        for pod in _pod_specs(doc):
            volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
            for container in pod["containers"]:
                for mount in container.get("volumeMounts", []):
                    source = volumes[mount["name"]].get("configMap")
                    if source and path.startswith(mount["mountPath"] + "/"):
                        return path.removeprefix(mount["mountPath"] + "/") in config_maps[source["name"]]["data"]
    return False


@pytest.mark.parametrize(("source", "module", "args"), ENTRYPOINTS,
                         ids=[f"{source}:{module}" for source, module, _ in ENTRYPOINTS])
def test_every_job_entrypoint_named_exists_and_takes_those_arguments(source: str, module: str, args: list[str]) -> None:
    job = importlib.import_module(module)
    command: click.Command = job.command
    assert callable(job.main) and isinstance(command, click.Command)
    options = {name for parameter in command.params for name in parameter.opts if name.startswith("-")}
    words = [arg.strip("[]") for arg in args]  # "[--prune]" in usage lines is the option --prune
    flags = [word.split("=", 1)[0] for word in words if word.startswith("-")]
    assert set(flags) <= options, f"{source}: {module} has no option {sorted(set(flags) - options)}"
    valued = {name for parameter in command.params if isinstance(parameter, click.Option) and not parameter.is_flag
              for name in parameter.opts}
    positional = [word for index, word in enumerate(words)
                  if not word.startswith("-") and not (index and words[index - 1] in valued)]
    arguments = [parameter for parameter in command.params if isinstance(parameter, click.Argument)]
    assert len(positional) >= len(arguments), f"{source}: {module} needs {[a.name for a in arguments]}"
    for value, parameter in zip(positional, arguments, strict=False):
        placeholder = value.isupper() or value.startswith("<")  # ROSTER, <path>: usage, not a file
        if isinstance(parameter.type, click.Path) and not placeholder:
            # A roster the job reads: in the repository (relative to --working-dir .) or mounted into the pod.
            assert (ROOT / value).is_file() or _container_file(value), f"{source}: {value!r} does not exist"
