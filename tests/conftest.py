"""Shared by every test folder: the one local Ray of the session, a real S3-compatible server on 127.0.0.1,
and tests/support on the path."""

from __future__ import annotations

import socket
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray

# Helpers under tests/support are importable from every test folder.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

S3_BUCKET = "rayfleet-tests"


METRICS_REPORT_INTERVAL_MS = 2000
"""How often the session's Ray workers report metrics to the node's metrics agent (Ray's default is 10 s)."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def ray_session() -> Iterator[int]:
    """One local Ray per test session, shared by tests/integration and tests/chaos (their conftests use it).

    Yields the port of the node's Prometheus endpoint (Ray's metrics agent, which runs
    without the dashboard), on a free port rather than Ray's default 8080.
    """
    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, namespace="rayfleet-tests", log_to_driver=False,
             _metrics_export_port=port, _system_config={"metrics_report_interval_ms": METRICS_REPORT_INTERVAL_MS})
    yield port
    ray.shutdown()


@pytest.fixture(scope="session")
def ray_metrics_url(ray_session: int) -> str:
    """The session Ray's Prometheus scrape URL on 127.0.0.1."""
    return f"http://127.0.0.1:{ray_session}/metrics"


@dataclass(frozen=True, slots=True)
class S3Server:
    """moto's S3 server on 127.0.0.1 with one bucket; any credentials are accepted."""

    endpoint: str
    bucket: str = S3_BUCKET

    def uri(self, prefix: str) -> str:
        """A ``pyarrow.fs`` URI for ``prefix`` in the bucket.

        The credentials ride in the URI, not in the environment: Ray workers were
        started before this server, with the environment of that moment, and the
        explicit keys keep the AWS SDK from probing instance metadata off this machine.
        """
        return (f"s3://test-key:test-secret@{self.bucket}/{prefix}"
                f"?endpoint_override={self.endpoint}&scheme=http&region=us-east-1")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """Start moto's server mode on a free port of 127.0.0.1 and create the test bucket."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = S3Server(endpoint=f"{host}:{port}")
        # rayfleet never creates buckets; the test does, through pyarrow itself.
        filesystem, _ = pafs.FileSystem.from_uri(s3.uri("setup") + "&allow_bucket_creation=true")
        filesystem.create_dir(s3.bucket)
        yield s3
    finally:
        server.stop()


@pytest.fixture
def s3_storage(s3_server: S3Server) -> str:
    """A storage URI under a fresh prefix of the test bucket, so tests never see each other's files."""
    return s3_server.uri(f"t-{uuid.uuid4().hex[:12]}")
