"""Ledger transactions over many identities beside a busy thread: ``python -m benchmarks.ledger_contention``.

A host commits its ledger work on threads of its own while its event loop runs Python.
SQLite's Python driver gives up the GIL for every statement it runs and every row it
steps, and a thread taking the GIL back from one that keeps running Python waits up
to the interpreter's switch interval (5 ms) each time. So what a ledger transaction
costs on a busy host depends on how many times it crosses into Python.

On a SQLite ledger holding ``--identities`` registered identities leased to two
holders (as two hosts would), this measures, with the process idle and with one more
thread spinning in Python (a stand-in for a busy event loop):

* the grant of a batch of ``--batch`` leases (``Ledger.acquire``, set-based);
* the renewal of one holder's leases (``Ledger.renew``: one ``UPDATE``);
* the same renewal in the row-by-row shape it had before (a ``SELECT`` of the
  holder's leases, then one ``UPDATE`` per lease through ``executemany``), in the
  same transaction discipline, for comparison;
* the renewal a host makes now that its holder row is armed (``Ledger.renew_holder``:
  one row, whatever the number of leases).

Medians over ``--rounds`` in seconds; results go to
``benchmarks/results/ledger_contention.json``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from rayfleet.ledger._ledger import Ledger
from rayfleet.ledger._sqlite import SqliteDatabase
from rayfleet.ledger._store import Transaction
from rayfleet.ledger._values import Activation, SpecRecord

from ._report import write_figures

TTL = 3600.0
REGISTER_BATCH = 5_000


def _rowwise_renew(tx: Transaction, *, holder: str, tokens: Mapping[str, int], now: float) -> int:
    """The renewal as it was written before: read every lease of ``holder``, update each one."""
    held = {row[0]: (row[1], row[2])
            for row in tx.execute("SELECT identity, token, ttl FROM leases WHERE holder = ?", (holder,))}
    extended = [(now + held[identity][1], identity) for identity, token in tokens.items()
                if identity in held and held[identity][0] == token]
    tx.executemany("UPDATE leases SET expires_at = ? WHERE identity = ?", extended)
    return len(extended)


def _timed(work: Callable[[], object], *, busy: bool) -> float:
    """Seconds ``work`` takes on a thread of its own, with another thread running Python meanwhile if ``busy``."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1_000))

    spinner = threading.Thread(target=spin, daemon=True)
    if busy:
        spinner.start()
    worker = threading.Thread(target=work)
    started = time.perf_counter()
    worker.start()
    worker.join()
    took = time.perf_counter() - started
    stop.set()
    if busy:
        spinner.join()
    return took


def measure(*, identities: int, batch: int, rounds: int) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="rayfleet-bench-ledger-"))
    database = SqliteDatabase(root / "ledger.sqlite")
    ledger = Ledger(database)
    names = [f"lc/{index}" for index in range(identities)]
    for start in range(0, identities, REGISTER_BATCH):
        ledger.register_many([SpecRecord(identity=name, spec=b"s" * 300, fingerprint="f", agent_class="m:C")
                              for name in names[start:start + REGISTER_BATCH]])
    tokens: dict[str, dict[str, int]] = {"host-a": {}, "host-b": {}}
    leased = names[: identities - batch * rounds * 2]
    for start in range(0, len(leased), batch):
        holder = "host-a" if (start // batch) % 2 else "host-b"
        for name, outcome in ledger.acquire(holder=holder, identities=leased[start:start + batch], ttl=TTL).items():
            assert isinstance(outcome, Activation)
            tokens[holder][name] = outcome.grant.fencing_token
    fresh = names[len(leased):]
    holder, held = "host-a", tokens["host-a"]

    def renew_rowwise(tx: Transaction) -> int:
        return _rowwise_renew(tx, holder=holder, tokens=held, now=time.time())

    ledger.arm_holder(holder=holder, ttl=TTL)
    figures: dict[str, dict[str, float]] = {}
    for busy in (False, True):
        side = "busy" if busy else "idle"
        grants: list[float] = []
        renewals: list[float] = []
        rowwise: list[float] = []
        by_holder: list[float] = []
        for _ in range(rounds):
            chunk, fresh = fresh[:batch], fresh[batch:]
            grants.append(_timed(functools.partial(ledger.acquire, holder="host-b", identities=chunk, ttl=TTL),
                                 busy=busy))
            renewals.append(_timed(lambda: ledger.renew(holder=holder, tokens=held), busy=busy))
            rowwise.append(_timed(lambda: database.write(renew_rowwise), busy=busy))
            by_holder.append(_timed(lambda: ledger.renew_holder(holder=holder, ttl=TTL), busy=busy))
        figures[side] = {
            f"grant of {batch} leases": statistics.median(grants),
            f"renewal of {len(held):,} leases": statistics.median(renewals),
            f"renewal of {len(held):,} leases, row by row": statistics.median(rowwise),
            f"renewal of {len(held):,} leases by their holder's row": statistics.median(by_holder),
        }
    ledger.close()
    return {"identities": identities, "batch": batch, "rounds": rounds, "seconds": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identities", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "ledger_contention.json")
    arguments = parser.parse_args()
    figures = measure(identities=arguments.identities, batch=arguments.batch, rounds=arguments.rounds)
    for side, rows in figures["seconds"].items():  # type: ignore[attr-defined]
        for what, seconds in rows.items():
            print(f"{side:5} {what:45} {seconds * 1000:10.1f} ms")
    write_figures(arguments.out, figures)


if __name__ == "__main__":
    main()
