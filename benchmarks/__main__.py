"""Run the benchmark suite: ``python -m benchmarks [--quick] [--only B1,B5] [--out PATH]`` (also ``rayfleet bench``).

``python -m benchmarks --markdown benchmarks/results/latest.json`` runs nothing and prints
a results file as the Markdown table the README shows.

Each benchmark (B1..B9, see the modules' docstrings and issue 12; B10 to B13, issue 30)
measures rayfleet beside its raw-Ray baseline in the same process, in interleaved
rounds after a warm-up, and reports the median over rounds and the spread of both
sides. Rows are printed as they finish, a table at the end, and everything is written as JSON
(default ``benchmarks/results/latest.json``). A missed target, or a benchmark that
raised, is a row with ``pass`` false; the exit code is 0 either way.

A local Ray (2 CPUs, no dashboard) is started unless this process already has one;
only a Ray started here is shut down at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import ray
from rich.console import Console

from . import (
    activation,
    calls,
    chat,
    density,
    failover,
    scatter,
    snapshots,
    spawning,
    streams,
    timers,
    turns,
    workflows,
)
from ._context import Context, Mode, PostgresLedgers, Unit
from ._report import Result, failed, line, markdown, show, write

UNITS: tuple[Unit, ...] = (
    *calls.UNITS, *activation.UNITS, *density.UNITS, *scatter.UNITS, *workflows.UNITS, *snapshots.UNITS,
    *failover.UNITS, *spawning.UNITS, *turns.UNITS, *timers.UNITS, *streams.UNITS, *chat.UNITS,
)
IDS = tuple(dict.fromkeys(unit.id for unit in UNITS))
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "latest.json"


def _ids(text: str) -> list[str]:
    wanted = [part.strip().upper() for part in text.split(",") if part.strip()]
    unknown = [part for part in wanted if part not in IDS]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(f"unknown benchmark id(s) {', '.join(unknown) or text!r}; "
                                         f"choose from {', '.join(IDS)}")
    return wanted


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="smaller sizes (under 3 minutes on 2 CPUs)")
    sizes.add_argument("--smoke", action="store_true", help="the smallest sizes (the smoke test's; figures "
                                                            "mean little)")
    parser.add_argument("--only", type=_ids, default=None, metavar="B1,B5", help="run only these benchmarks")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default: {DEFAULT_OUT})")
    parser.add_argument("--markdown", type=Path, default=None, metavar="RESULTS.json",
                        help="run nothing: print the rows of a results file as a Markdown table (the README's)")
    return parser


def run(mode: Mode, *, only: Sequence[str] | None = None, out: Path = DEFAULT_OUT,
        on_result: Callable[[Result], None] | None = None, say: Callable[[str], None] = print) -> list[Result]:
    """Run the benchmarks (all, or ``only`` these ids) at ``mode``'s sizes; write ``out``; return the rows.

    Uses the Ray this process already has, else starts a local one (and then shuts it down).
    """
    units = [unit for unit in UNITS if only is None or unit.id in only]
    started_ray = False
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        started_ray = True
    postgres = PostgresLedgers()
    context = Context(mode, postgres=postgres)
    results: list[Result] = []
    skipped: list[dict[str, str]] = []
    began = time.perf_counter()
    try:
        for unit in units:
            if unit.store == "postgresql" and (problem := postgres.problem()) is not None:
                skipped.append({"benchmark": unit.label, "reason": problem})
                say(f"skipped {unit.label}: {problem}")
                continue
            unit_began = time.perf_counter()
            try:
                rows = unit.run(context, unit.store)
            except Exception as error:  # noqa: BLE001 - one benchmark's failure is its row; the rest still run
                rows = [failed(unit.label, error)]
            for row in rows:
                results.append(row)
                if on_result is not None:
                    on_result(row)
            say(f"  ({unit.label}: {time.perf_counter() - unit_began:.1f} s)")
    finally:
        postgres.close()
        try:
            write(out, mode=mode, results=results, skipped=skipped, seconds=time.perf_counter() - began)
        finally:
            if started_ray:
                ray.shutdown()
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the suite; ``argv`` as on the command line (``None``: ``sys.argv[1:]``). Always returns 0."""
    options = _parser().parse_args(argv)
    if options.markdown is not None:
        print(markdown(json.loads(options.markdown.read_text())))
        return 0
    mode: Mode = "smoke" if options.smoke else "quick" if options.quick else "full"
    # Rows and the table are wide; a pipe or a log file gets them unwrapped rather than at 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 200)
    began = time.perf_counter()
    results = run(mode, only=options.only, out=options.out, on_result=lambda row: console.print(line(row)),
                  say=lambda text: console.print(text, highlight=False))
    show(console, results, title=f"rayfleet benchmarks ({mode}, {time.perf_counter() - began:.0f} s)")
    console.print(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
