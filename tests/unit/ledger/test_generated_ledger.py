"""The generated ledger transports are what ``tools/gen_ledger.py`` writes from the contract today."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[3] / "tools" / "gen_ledger.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_ledger", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_ledger", module)
    spec.loader.exec_module(module)
    return module


def test_generated_transports_are_up_to_date() -> None:
    generator = _generator()
    stale = generator.outdated()
    assert not stale, f"{[str(path) for path in stale]} out of date with the ledger contract; run `{generator.COMMAND}`"


def test_check_fails_and_names_the_command_when_a_generated_file_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    generator = _generator()
    # A copy of the package whose contract gained an operation the generated files do not have yet.
    package = tmp_path / "rayfleet"
    for path in generator.generated():
        relative = path.relative_to(generator.PACKAGE)
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(path.read_text())
    contract = generator.CONTRACT.read_text().replace(
        "    def hosts(self) -> LedgerCall[list[HostInfo]]:",
        "    def host_count(self) -> LedgerCall[int]:\n        ...\n\n    def hosts(self) -> LedgerCall[list[HostInfo]]:",
    )
    facade = generator.FACADE.read_text().replace(
        "    def hosts(self) -> list[HostInfo]:",
        "    def host_count(self) -> int:\n        return 0\n\n    def hosts(self) -> list[HostInfo]:",
    )
    (package / "ledger" / "_contract.py").write_text(contract)
    (package / "ledger" / "_ledger.py").write_text(facade)
    monkeypatch.setattr(generator, "PACKAGE", package)
    monkeypatch.setattr(generator, "CONTRACT", package / "ledger" / "_contract.py")
    monkeypatch.setattr(generator, "FACADE", package / "ledger" / "_ledger.py")

    assert generator.main(["--check"]) == 1
    message = capsys.readouterr().err
    assert "_generated_local.py is out of date" in message and "_generated_actor.py is out of date" in message
    assert "run `python tools/gen_ledger.py`" in message

    assert generator.main([]) == 0  # regenerating brings both up to date, each with the new operation
    assert generator.main(["--check"]) == 0
    assert "def host_count(self) -> LedgerCall[int]:" in (package / "ledger" / "_generated_local.py").read_text()
    actor = (package / "platform" / "_generated_actor.py").read_text()
    assert "def host_count(self) -> Answer[int]:" in actor and "self.actor.host_count.remote()" in actor


def test_an_operation_the_facade_lacks_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generator = _generator()
    contract = tmp_path / "_contract.py"
    contract.write_text(generator.CONTRACT.read_text().replace(
        "    def hosts(self) -> LedgerCall[list[HostInfo]]:",
        "    def host_count(self) -> LedgerCall[int]:\n        ...\n\n    def hosts(self) -> LedgerCall[list[HostInfo]]:",
    ))
    monkeypatch.setattr(generator, "CONTRACT", contract)
    with pytest.raises(SystemExit, match="Ledger has no method host_count"):
        generator.generated()
