"""The deployment files parse and point at entrypoints that exist."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml

from rayfleet.ledger._location import LedgerLocation

DEPLOYMENTS = Path(__file__).resolve().parents[2] / "deployments"


def test_ray_up_config_has_what_ray_up_needs() -> None:
    config = yaml.safe_load((DEPLOYMENTS / "local-cluster.yaml").read_text())
    assert config["provider"]["type"] == "local"
    assert config["cluster_name"] and config["head_start_ray_commands"] and config["worker_start_ray_commands"]
    assert any("ray start --head" in command for command in config["head_start_ray_commands"])


def test_rayjob_runs_an_importable_entrypoint() -> None:
    job = yaml.safe_load((DEPLOYMENTS / "kuberay-rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    entrypoint = job["spec"]["entrypoint"].split()
    assert entrypoint[:2] == ["python", "-m"]
    module = importlib.import_module(entrypoint[2])
    assert callable(module.main)
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"].startswith("rayproject/ray:")


def test_rayjob_with_a_worker_group_keeps_snapshots_where_every_pod_reads_them() -> None:
    # A pod's /tmp is its own: a host on another pod could not read a snapshot written there.
    job = yaml.safe_load((DEPLOYMENTS / "kuberay-rayjob.yaml").read_text())
    assert job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]
    assert "://" in env["RAYFLEET_STORAGE"], env
    assert LedgerLocation.parse(env["RAYFLEET_LEDGER"]).kind in ("sqlite", "postgresql")
