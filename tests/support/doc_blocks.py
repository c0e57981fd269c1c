"""The Python code blocks of a Markdown page, and how the docs tests run them.

The convention, shared with whoever writes the docs:

* every fenced block whose info string starts with ``python`` (or ``py``) runs;
* the blocks of one page run in order, in one namespace, as one script would;
* top-level ``await`` (and ``async for``/``async with``) is allowed: such a block runs
  to completion in the page's one event loop;
* a block whose nearest non-blank line above is ``<!-- skip: reason -->`` does not run
  (the reason is required), and a skip marker that is not followed by a Python block is
  an error, so a marker cannot silently stop covering anything.

Parsing is strict: a fence that is never closed is an error naming the page and line
(it would swallow the rest of the page, and every block in it would go untested).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import re
import sys
import traceback
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PYTHON_LANGUAGES = frozenset({"python", "py", "python3"})

# Any indentation: fences nested in list items and content tabs (pymdownx.superfences) are
# indented by four spaces or more, and their blocks must run too.
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_SKIP = re.compile(r"^\s*<!--\s*skip\s*:(?P<reason>.*?)-->\s*$")
_SKIP_LOOSE = re.compile(r"^\s*<!--\s*skip\b", re.IGNORECASE)


class DocParseError(ValueError):
    """A page breaks the code-block convention; the message names the page and line."""


class DocBlockError(AssertionError):
    """A block of a page raised; the message names the page, the block's line and what it raised."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeBlock:
    """One fenced Python block of a page."""

    page: Path
    """The Markdown file it is in."""
    line: int
    """1-based line of its first code line (the line after the opening fence)."""
    source: str
    """The code, with the fence's indentation removed."""
    skip_reason: str | None = None
    """Why it is not run (from ``<!-- skip: reason -->``), or ``None`` when it runs."""

    @property
    def where(self) -> str:
        """``page:line`` of the block's first code line, for messages."""
        return f"{self.page}:{self.line}"


def parse_blocks(text: str, page: Path) -> list[CodeBlock]:
    """The Python blocks of a Markdown page, in order, skipped ones included.

    Raises:
        DocParseError: an unterminated fence, a skip marker without a reason or not
            followed by a Python block, or a malformed skip marker.
    """
    lines = text.splitlines()
    blocks: list[CodeBlock] = []
    pending_skip: tuple[int, str] | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        opening = _FENCE.match(line)
        if opening is None:
            if _SKIP_LOOSE.match(line):
                marker = _SKIP.match(line)
                if marker is None or not marker.group("reason").strip():
                    raise DocParseError(
                        f"{page}:{index + 1}: a skip marker must read `<!-- skip: reason -->` with a reason, "
                        f"got {line.strip()!r}")
                if pending_skip is not None:
                    raise DocParseError(f"{page}:{pending_skip[0]}: skip marker not followed by a Python block")
                pending_skip = (index + 1, marker.group("reason").strip())
            elif line.strip() and pending_skip is not None:
                raise DocParseError(f"{page}:{pending_skip[0]}: skip marker not followed by a Python block "
                                    f"(line {index + 1} comes first)")
            index += 1
            continue
        fence, indent = opening.group("fence"), len(opening.group("indent"))
        info = opening.group("info").strip()
        if fence[0] == "`" and "`" in info:
            index += 1  # an inline code span that starts a line, not a fence (CommonMark)
            continue
        closing = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        body_start = index + 1
        end = body_start
        while end < len(lines) and closing.match(lines[end]) is None:
            end += 1
        if end == len(lines):
            raise DocParseError(f"{page}:{index + 1}: the code fence {fence}{info} is never closed")
        language = info.split(maxsplit=1)[0].lstrip("{.").rstrip("}").lower() if info else ""
        if language in PYTHON_LANGUAGES:
            body = [_dedent(code_line, indent) for code_line in lines[body_start:end]]
            blocks.append(CodeBlock(page=page, line=body_start + 1, source="\n".join(body) + "\n",
                                    skip_reason=pending_skip[1] if pending_skip else None))
        elif pending_skip is not None:
            raise DocParseError(f"{page}:{pending_skip[0]}: skip marker precedes a {language or 'plain'} block, "
                                f"not a Python one")
        pending_skip = None
        index = end + 1
    if pending_skip is not None:
        raise DocParseError(f"{page}:{pending_skip[0]}: skip marker not followed by a Python block")
    return blocks


def _dedent(line: str, indent: int) -> str:
    """``line`` without up to ``indent`` leading spaces (the fence's own indentation, as CommonMark does)."""
    removable = len(line) - len(line.lstrip(" "))
    return line[min(indent, removable):]


def compile_block(block: CodeBlock, *, root: Path) -> types.CodeType:
    """The block compiled so that tracebacks show the page (``root / block.page``) at its real lines.

    Raises:
        DocBlockError: the block is not valid Python.
    """
    try:
        tree = ast.parse(block.source, filename=str(block.page))
    except SyntaxError as error:
        line = block.line + (error.lineno or 1) - 1
        raise DocBlockError(f"{block.page}:{line}: not valid Python: {error.msg}") from None
    ast.increment_lineno(tree, block.line - 1)
    return compile(tree, str(root / block.page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)


def run_page(blocks: list[CodeBlock], *, root: Path, script: Path) -> int:
    """Run a page's unskipped blocks in order, in one namespace, as the script ``script`` would.

    The namespace is a fresh ``__main__`` module (installed as ``sys.modules["__main__"]``
    while the page runs, as ``python script.py`` has it), so agent classes a page defines
    travel to the hosts the way a user's script's classes do. Returns how many blocks ran.

    Raises:
        DocBlockError: a block raised; the message names the page and the block's line,
            and the block's exception is its cause.
    """
    module = types.ModuleType("__main__")
    module.__file__ = str(script)
    compiled = [(block, compile_block(block, root=root)) for block in blocks if block.skip_reason is None]
    loop = asyncio.new_event_loop()
    ran = 0
    try:
        with _as_main(module):
            for number, (block, code) in enumerate(compiled, start=1):
                try:
                    result = eval(code, module.__dict__)
                    if asyncio.iscoroutine(result):
                        loop.run_until_complete(result)
                except Exception as error:
                    raise DocBlockError(
                        f"{block.where}: block {number} of {len(compiled)} run on this page raised "
                        f"{type(error).__name__}: {error}\n{_trace_from(error, code.co_filename)}") from error
                ran += 1
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return ran


def _trace_from(error: BaseException, filename: str) -> str:
    """``error``'s traceback from the page's first frame on (the runner's own frames are noise)."""
    trace = error.__traceback__
    while trace is not None and trace.tb_frame.f_code.co_filename != filename:
        trace = trace.tb_next
    return "".join(traceback.format_exception(type(error), error, trace or error.__traceback__))


@contextlib.contextmanager
def _as_main(module: types.ModuleType) -> Iterator[None]:
    previous = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        yield
    finally:
        if previous is not None:
            sys.modules["__main__"] = previous


def doc_pages(root: Path) -> list[Path]:
    """README.md and every Markdown page under docs/, relative to ``root``, sorted."""
    pages = [Path("README.md")] if (root / "README.md").exists() else []
    pages += sorted(path.relative_to(root) for path in (root / "docs").rglob("*.md"))
    return pages
