"""What every example ends with: its checks, printed one a line, and an exit status that says whether they held."""

from __future__ import annotations

from collections.abc import Mapping


def conclude(example: str, checks: Mapping[str, bool]) -> None:
    """Print each check as ok or FAILED; return when all held, else exit with status 1.

    Raises:
        SystemExit: a check failed (the message names the example).
    """
    for check, held in checks.items():
        print(f"  [{'ok' if held else 'FAILED'}] {check}")
    if not all(checks.values()):
        raise SystemExit(f"{example}: a check failed")
    print(f"{example}: all checks held")
