"""Commands that bring their own Ray and fleet: ``demo`` and ``bench``."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import click

from ._exit import CommandError
from ._session import FleetOptions, pass_options


@click.command()
@pass_options
def demo(options: FleetOptions) -> None:
    """Run the end-to-end demo on its own fleet (a local Ray starts by itself); exit 0 when every check held."""
    from ..demo._script import run_demo

    # --namespace is not used: the demo keeps to its own namespace, so it never touches a real fleet.
    code = run_demo(storage=options.storage, address=options.address, ledger=options.ledger, say=click.echo)
    if code:
        raise click.exceptions.Exit(code)


def _benchmarks_main() -> Any:
    """``main`` of ``benchmarks/__main__.py`` in the current directory (a rayfleet checkout)."""
    here = str(Path.cwd())
    if not (Path(here) / "benchmarks" / "__main__.py").is_file():
        raise CommandError("`rayfleet bench` runs the benchmarks/ folder of a rayfleet checkout, and there is none "
                           f"in {here}; run it from the repository's root directory")
    # A console script's sys.path does not hold the current directory.
    if here not in sys.path and os.path.realpath(here) not in map(os.path.realpath, sys.path):
        sys.path.insert(0, here)
    return importlib.import_module("benchmarks.__main__").main


@click.command()
@click.option("--quick", is_flag=True, help="Fewer samples (about a minute).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Where to write the JSON results (default: benchmarks/results/latest.json).")
def bench(quick: bool, out: str | None) -> None:
    """Run the benchmarks of a rayfleet checkout, each beside raw Ray (starts its own local Ray)."""
    main = _benchmarks_main()
    main([*(["--quick"] if quick else []), *(["--out", out] if out else [])])
