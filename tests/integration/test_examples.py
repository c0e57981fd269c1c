"""Every script in examples/ runs as a user runs it, and its own checks hold.

Each script is run with ``runpy`` as ``__main__`` (exactly the file a user runs with
``python examples/x.py``), in-process against the session's local Ray, with
``rf.connect()`` pointed by the environment at a fresh storage folder and namespace.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
from user_scripts import REPO, UserSetting, actors_in

EXAMPLES = sorted(path for path in (REPO / "examples").glob("*.py") if not path.name.startswith("_"))
"""The scripts; ``_``-modules are their helpers."""


def test_the_examples_are_the_ones_the_docs_promise() -> None:
    assert {path.name for path in EXAMPLES} >= {"quickstart.py", "team.py", "saga.py", "operate.py"}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_example_runs_and_its_checks_hold(
    script: Path, user: UserSetting, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(script.parent))  # as `python examples/x.py` puts the script's folder first
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_:
        pytest.fail(f"{script.name} exited with {exit_.code!r}:\n{capsys.readouterr().out}")
    out = capsys.readouterr().out
    assert f"{script.stem}: all checks held" in out, out
    # The script's fleet ran where the environment told rf.connect() to put it.
    assert (user.storage / "fleet.json").exists()
    assert any(name.startswith("rayfleet-host-") for name in actors_in(user.namespace))
