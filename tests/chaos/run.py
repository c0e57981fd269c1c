"""Run a chaos profile by hand: ``python -m tests.chaos.run --profile long [--ledger postgresql://...]``.

Starts its own local Ray (2 CPUs, no dashboard), runs the profile on a fresh fleet in a
temporary folder, prints the table and writes it as JSON (``--out``, default
``chaos-<profile>.json``). Exits 1 when the checker found a violation.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))

import chaos_harness
import ray


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(chaos_harness.PROFILES), default="long")
    parser.add_argument("--ledger", default=None, help="a postgresql:// URL (default: the SQLite ledger)")
    parser.add_argument("--minutes", type=float, default=None, help="override the profile's duration")
    parser.add_argument("--faults", default="", help="only these fault kinds, comma-separated (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    profile = chaos_harness.PROFILES[args.profile]
    if args.minutes is not None:
        profile = dataclasses.replace(profile, duration=args.minutes * 60)
    if args.faults:
        profile = dataclasses.replace(profile, faults=tuple(kind.strip() for kind in args.faults.split(",")))
    ray.init(num_cpus=2, include_dashboard=False, namespace="rayfleet-chaos", log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory(prefix="rayfleet-chaos-") as folder:
            run = chaos_harness.ChaosRun(profile, storage=Path(folder) / "store", ledger=args.ledger)
            result = run.run()
            print(result.table())
            out = args.out or Path(f"chaos-{profile.name}.json")
            run.write_json(result, out)
            print(f"written to {out}")
    finally:
        ray.shutdown()
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
