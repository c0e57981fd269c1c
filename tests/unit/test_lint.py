"""ruff and mypy, configured in pyproject.toml, are clean on rayfleet/: a finding fails the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=REPO, capture_output=True, text=True, check=False,
                          timeout=600)


@pytest.mark.timeout(600)
def test_ruff_is_clean() -> None:
    result = _run("ruff", "check", "rayfleet", "tests", "benchmarks", "examples", "tools")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(600)
def test_mypy_is_clean() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
