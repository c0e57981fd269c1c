"""What a benchmark produces (:class:`Result`), how targets are judged, and how results are shown and written.

A missed target is a result with ``pass`` false, and a benchmark that raised is a
result with ``pass`` false and the error text: neither stops the suite, and neither
changes the exit code (the figures are the product).
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import ray
from rich.console import Console
from rich.table import Table

import rayfleet as rf

from ._measure import Spread


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """The bar a figure must clear; every limit given must hold.

    ``ratio_*`` judge rayfleet / baseline, ``value_*`` the rayfleet figure itself
    (``value_below`` strictly).
    """

    text: str
    ratio_max: float | None = None
    ratio_min: float | None = None
    value_max: float | None = None
    value_min: float | None = None
    value_below: float | None = None

    def met(self, value: float | None, ratio: float | None) -> bool:
        """Whether ``value`` (and its ``ratio``) clear every limit; a missing figure never does."""
        checks: list[bool] = []
        if self.ratio_max is not None or self.ratio_min is not None:
            if ratio is None or not math.isfinite(ratio):
                return False
            checks += [self.ratio_max is None or ratio <= self.ratio_max,
                       self.ratio_min is None or ratio >= self.ratio_min]
        if self.value_max is not None or self.value_min is not None or self.value_below is not None:
            if value is None or not math.isfinite(value):
                return False
            checks += [self.value_max is None or value <= self.value_max,
                       self.value_min is None or value >= self.value_min,
                       self.value_below is None or value < self.value_below]
        return all(checks)


def at_most(ratio: float) -> Target:
    return Target(text=f"<= {ratio:g}x", ratio_max=ratio)


def at_least(ratio: float) -> Target:
    return Target(text=f">= {ratio:g}x", ratio_min=ratio)


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """One row of the results: a rayfleet figure beside its baseline, judged against its target."""

    name: str
    """Starts with the benchmark's id (``B1``..``B14``)."""
    rayfleet: float | None
    baseline: float | None
    ratio: float | None
    unit: str
    target: str
    passed: bool
    spread: Mapping[str, Any] = field(default_factory=dict)
    detail: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def id(self) -> str:
        return self.name.split(" ", 1)[0]

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "name": self.name, "rayfleet": _finite(self.rayfleet), "baseline": _finite(self.baseline),
            "ratio": _finite(self.ratio), "unit": self.unit, "target": self.target, "pass": self.passed,
            "spread": _plain(self.spread),
        }
        if self.detail:
            row["detail"] = _plain(self.detail)
        if self.error is not None:
            row["error"] = self.error
        return row


def measured(
    name: str, *, rayfleet: Spread, baseline: Spread | None, unit: str, target: Target,
    detail: Mapping[str, Any] | None = None, ratio: float | None = None, value: float | None = None,
) -> Result:
    """A row from the per-round figures of both sides.

    The rayfleet figure is the median over rounds unless ``value`` is given (a total, say);
    the ratio is of the figure and the baseline's median unless given.
    """
    value = rayfleet.median if value is None else value
    base = None if baseline is None else baseline.median
    if ratio is None and base is not None:
        ratio = value / base if base else math.inf
    spread: dict[str, Any] = {"rayfleet": rayfleet.as_dict()}
    if baseline is not None:
        spread["baseline"] = baseline.as_dict()
    return Result(name=name, rayfleet=value, baseline=base, ratio=ratio, unit=unit, target=target.text,
                  passed=target.met(value, ratio), spread=spread, detail=dict(detail or {}))


def failed(name: str, error: BaseException, *, detail: Mapping[str, Any] | None = None) -> Result:
    """The row of a benchmark that raised: no figures, ``pass`` false, the error text."""
    text = f"{type(error).__name__}: {error}"
    return Result(name=name, rayfleet=None, baseline=None, ratio=None, unit="", target="", passed=False,
                  detail=dict(detail or {}), error=text)


def _plain(value: Any) -> Any:
    """``value`` with every non-finite float (a round with nothing to divide by) as ``None``: JSON has no infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _finite(value: float | None) -> float | None:
    """``value`` for JSON: ``None`` for a missing or non-finite figure (JSON has no infinity)."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, 6)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    resources = ray.cluster_resources() if ray.is_initialized() else {}
    return {
        "cpus": os.cpu_count(),
        "ray_cpus": resources.get("CPU"),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "rayfleet": rf.__version__,
        "platform": platform.platform(),
    }


def write(path: Path, *, mode: str, results: Sequence[Result], skipped: Sequence[Mapping[str, str]],
          seconds: float) -> None:
    """Write the JSON report (``results`` in the order they ran)."""
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mode": mode,
        "seconds": round(seconds, 1),
        "machine": machine(),
        "results": [result.to_json() for result in results],
        "skipped": [dict(entry) for entry in skipped],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


def write_figures(path: Path, figures: Mapping[str, Any]) -> None:
    """Write a stand-alone measurement's JSON report: when, on what machine, and ``figures``."""
    report = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(), **figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {path}")


def number(value: float | None) -> str:
    """A figure with three significant digits (thousands grouped), or an em dash when there is none."""
    if value is None or not math.isfinite(value):
        return "—"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    digits = max(0, 2 - magnitude)
    return f"{value:,.{digits}f}"


def _ratio(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{number(value)}x"


def _range(spread: Mapping[str, Any], side: str) -> str:
    figures = spread.get(side)
    if not isinstance(figures, Mapping):
        return ""
    return f"{number(figures.get('min'))}..{number(figures.get('max'))}"


def _verdict(result: Result) -> str:
    if result.error is not None:
        return "[red]error[/red]"
    return "[green]pass[/green]" if result.passed else "[yellow]miss[/yellow]"


def line(result: Result) -> str:
    """One finished row as a console line."""
    if result.error is not None:
        return f"{_verdict(result)} {result.name}: {result.error}"
    base = "" if result.baseline is None else f"  baseline {number(result.baseline)}  ratio {_ratio(result.ratio)}"
    return (f"{_verdict(result)} {result.name}: rayfleet {number(result.rayfleet)} {result.unit}{base}"
            f"  (target {result.target})")


def table(results: Sequence[Result], *, title: str) -> Table:
    """Every row, with the spread (lowest..highest round) of both sides."""
    grid = Table(title=title, show_lines=False)
    for heading, justify in (("benchmark", "left"), ("rayfleet", "right"), ("baseline", "right"),
                             ("ratio", "right"), ("unit", "left"), ("target", "left"), ("", "left"),
                             ("rounds: rayfleet | baseline", "left")):
        grid.add_column(heading, justify=justify)  # type: ignore[arg-type]
    for result in results:
        if result.error is not None:
            grid.add_row(result.name, "—", "—", "—", "", "", _verdict(result), result.error[:80])
            continue
        spread = _range(result.spread, "rayfleet")
        if "baseline" in result.spread:
            spread += f" | {_range(result.spread, 'baseline')}"
        grid.add_row(result.name, number(result.rayfleet), number(result.baseline), _ratio(result.ratio),
                     result.unit, result.target, _verdict(result), spread)
    return grid


def markdown(report: Mapping[str, Any]) -> str:
    """The rows of a written JSON report as a Markdown table (the README's), in the order they ran."""
    lines = ["| benchmark | rayfleet | raw Ray | ratio | unit | target | |", "|---|---|---|---|---|---|---|"]
    for row in report["results"]:
        verdict = "error" if row.get("error") else "pass" if row["pass"] else "miss"
        lines.append(f"| {row['name']} | {number(row['rayfleet'])} | {number(row['baseline'])} | "
                     f"{_ratio(row['ratio'])} | {row['unit']} | {row['target']} | {verdict} |")
    return "\n".join(lines)


def show(console: Console, results: Sequence[Result], *, title: str) -> None:
    console.print(table(results, title=title))
