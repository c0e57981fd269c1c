"""MkDocs hooks: content generated at build time, so the site never drifts from the code.

* ``benchmarks.md``: the marker ``<!-- benchmark-table -->`` becomes the table that
  ``python -m benchmarks --markdown benchmarks/results/latest.json`` prints (the same
  command a reader runs), plus the machine the results file says it was measured on.
* ``reference/api.md``: the marker ``<!-- api-reference -->`` becomes one mkdocstrings
  entry (``::: rayfleet.Name``) per name of ``rayfleet.__all__``, under the group
  comments of that list, so a name added to, renamed in or removed from the public API
  appears, moves or goes without editing the page.

A failure (the command fails, the results file or ``__all__`` cannot be read) raises
``PluginError``, which fails the build: a page with a missing table is never published.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path("benchmarks") / "results" / "latest.json"
BENCHMARK_MARKER = "<!-- benchmark-table -->"
API_MARKER = "<!-- api-reference -->"


def benchmark_table() -> str:
    """The results table of ``RESULTS`` as ``python -m benchmarks --markdown`` prints it, with its machine."""
    command = [sys.executable, "-m", "benchmarks", "--markdown", str(RESULTS)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PluginError(f"{' '.join(command[1:])} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    try:
        report = json.loads((ROOT / RESULTS).read_text())
    except (OSError, ValueError) as error:
        raise PluginError(f"cannot read {RESULTS}: {error}") from error
    machine = report.get("machine", {})
    measured = (f"Measured in `{report.get('mode', '?')}` mode on {machine.get('cpus', '?')} CPUs "
                f"({machine.get('memory_gib', '?')} GiB), Python {machine.get('python', '?')}, "
                f"Ray {machine.get('ray', '?')}, rayfleet {machine.get('rayfleet', '?')}; "
                f"the suite took {report.get('seconds', '?')} s.")
    skipped = report.get("skipped") or []
    notes = "".join(f"\n\nSkipped: {entry.get('benchmark')}: {entry.get('reason')}." for entry in skipped)
    return f"{done.stdout.strip()}\n\n{measured}{notes}\n"


def public_groups(init: Path) -> list[tuple[str, list[str]]]:
    """``__all__`` of ``init`` as (group comment, names) in source order; names before any comment go under "Names"."""
    source = init.read_text()
    assignment = next((node for node in ast.parse(source).body if isinstance(node, ast.Assign)
                       and any(isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets)),
                      None)
    if assignment is None or assignment.end_lineno is None:
        raise PluginError(f"{init} has no __all__ list")
    groups: list[tuple[str, list[str]]] = []
    for text in source.splitlines()[assignment.lineno:assignment.end_lineno]:
        text = text.strip()
        if text.startswith("#"):
            groups.append((text.lstrip("# ").strip(), []))
        elif text.startswith('"'):
            if not groups:
                groups.append(("Names", []))
            groups[-1][1].append(text.strip('",'))
    return groups


def api_reference() -> str:
    """One section per group of ``rayfleet.__all__``, one mkdocstrings entry per name."""
    sections = []
    for title, names in public_groups(ROOT / "rayfleet" / "__init__.py"):
        entries = "\n\n".join(f"::: rayfleet.{name}" for name in names)
        sections.append(f"## {title}\n\n{entries}\n")
    return "\n".join(sections)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace this site's markers with their generated content (see the module docstring)."""
    if BENCHMARK_MARKER in markdown:
        markdown = markdown.replace(BENCHMARK_MARKER, benchmark_table())
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, api_reference())
    return markdown
