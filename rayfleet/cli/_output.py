"""How commands show what they return: rich tables for people, JSON for programs, progress on stderr.

Data goes to stdout, and only data: with ``--json`` it is one JSON document (no rich
markup, no colour), so ``rayfleet list --json | jq`` works. Progress, spinners and
errors go to stderr, and only when stderr is a terminal for the animated ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click
import pydantic
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout instead of a table.")
"""The ``--json`` flag of every command whose output is data."""

ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(done, total)`` by a long operation, as often as it likes."""


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types: dataclasses and pydantic models as objects, enums as values, tuples as lists."""
    if isinstance(value, pydantic.BaseModel):
        return jsonable(value.model_dump(mode="json"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: jsonable(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(item) for item in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)  # a handler may return anything; the text is better than a refusal


def emit_json(value: Any) -> None:
    """Print ``value`` as one indented JSON document on stdout."""
    click.echo(json.dumps(jsonable(value), indent=2))


PIPED_WIDTH = 120
"""Columns of a table written to a pipe or a file, which need not fit an 80-column terminal."""


def stdout_console() -> Console:
    # Made per call: the console then writes to whatever sys.stdout is now (tests swap it).
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, PIPED_WIDTH)
    return console


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a table: the row key it shows, its header, and how a value reads."""

    key: str
    header: str
    show: Callable[[Any], str] | None = None


def cell(value: Any) -> str:
    """How a value reads in a table cell."""
    if value is None or value == "":
        return "-"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ", ".join(f"{key}={item}" for key, item in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(cell(item) for item in value) or "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def moment(value: Any) -> str:
    """A ``time.time()`` value as local date and time."""
    if not isinstance(value, (int, float)):
        return cell(value)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))


def emit_table(rows: Sequence[Any], columns: Sequence[Column], *, title: str, empty: str) -> None:
    """Print ``rows`` (dataclasses or mappings) as a table, or the ``empty`` line when there are none."""
    console = stdout_console()
    if not rows:
        console.print(Text(empty))
        return
    table = Table(title=title, title_justify="left")
    for index, column in enumerate(columns):
        # The first column names the row (an identity, a run id): it is never broken over lines.
        table.add_column(column.header, overflow="fold", no_wrap=index == 0)
    for row in rows:
        values = row if isinstance(row, Mapping) else {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
        # Text, not str: an identity or an error text with [brackets] must not read as rich markup.
        table.add_row(*(Text((column.show or cell)(values.get(column.key))) for column in columns))
    console.print(table)


def emit_fields(fields: Mapping[str, Any], *, title: str) -> None:
    """Print one record as a two-column table of names and values."""
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name, value in fields.items():
        table.add_row(Text(name), Text(cell(value)))
    stdout_console().print(table)


def emit_line(text: str) -> None:
    """Print one line of plain text on stdout (never read as markup)."""
    stdout_console().print(Text(text))


@contextlib.contextmanager
def working(description: str) -> Iterator[None]:
    """A spinner with the elapsed time on stderr while one long call runs (nothing when stderr is no terminal)."""
    console = stderr_console()
    if not console.is_terminal:
        yield
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        progress.add_task(description, total=None)
        yield


@contextlib.contextmanager
def counting(description: str, *, console: Console | None = None) -> Iterator[ProgressCallback]:
    """A progress bar on stderr; yields the ``progress(done, total)`` callback that moves it.

    When stderr is not a terminal the callback does nothing, so piped output stays clean.
    """
    console = console or stderr_console()
    if not console.is_terminal:
        yield lambda done, total: None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task(description, total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield advance
