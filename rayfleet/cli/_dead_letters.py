"""``dead-letters list|replay|purge``: messages that could not be handled."""

from __future__ import annotations

import time

import click

from ._output import Column, emit_json, emit_line, emit_table, json_option, moment
from ._session import FleetOptions, open_fleet, open_records, pass_options

LETTER_COLUMNS = (
    Column("id", "id"),
    Column("identity", "identity"),
    Column("method", "method"),
    Column("reason", "reason"),
    Column("attempts", "attempts"),
    Column("at", "at", moment),
    Column("error", "error"),
)


@click.group("dead-letters")
def dead_letters() -> None:
    """Messages that could not be handled: list, replay, purge."""


@dead_letters.command("list")
@click.option("--identity", default=None, help="Only the letters of this identity.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True, help="At most this many.")
@json_option
@pass_options
def list_letters(options: FleetOptions, identity: str | None, limit: int, as_json: bool) -> None:
    """List dead letters, oldest first (also of a stopped fleet)."""
    with open_records(options) as fleet:
        letters = fleet.dead_letters(identity, limit=limit)
    if as_json:
        emit_json(letters)
        return
    rows = [{"id": letter.id, "identity": letter.identity, "method": letter.envelope.method, "reason": letter.reason,
             "attempts": letter.attempts, "at": letter.at, "error": letter.error} for letter in letters]
    emit_table(rows, LETTER_COLUMNS, title="dead letters", empty="no dead letters")


@dead_letters.command()
@click.argument("letter_id", type=int)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Give up waiting for the reply after this long (the letter stays; exit 1).")
@pass_options
def replay(options: FleetOptions, letter_id: int, timeout: float | None) -> None:
    """Send dead letter LETTER_ID's message again and print the reply as JSON (the letter is then removed)."""
    with open_fleet(options) as fleet:
        reply = fleet.replay_dead_letter(letter_id, timeout=timeout)
    emit_json(reply)


@dead_letters.command()
@click.option("--identity", default=None, help="Only the letters of this identity.")
@click.option("--id", "ids", type=int, multiple=True, help="Only this letter (repeat for more).")
@click.option("--older-than", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Only letters recorded longer ago than this.")
@click.option("--all", "everything", is_flag=True, help="Every letter (needed when no other filter is given).")
@json_option
@pass_options
def purge(options: FleetOptions, identity: str | None, ids: tuple[int, ...], older_than: float | None,
          everything: bool, as_json: bool) -> None:
    """Delete the dead letters matching every filter given."""
    if identity is None and not ids and older_than is None and not everything:
        raise click.UsageError("purge deletes every dead letter matching its filters; give --identity, --id or "
                               "--older-than, or --all to delete them all")
    before = None if older_than is None else time.time() - older_than
    with open_fleet(options) as fleet:
        purged = fleet.purge_dead_letters(identity, ids=list(ids) or None, before=before)
    if as_json:
        emit_json({"purged": purged})
    else:
        emit_line(f"purged {purged} dead letter{'s' * (purged != 1)}")
