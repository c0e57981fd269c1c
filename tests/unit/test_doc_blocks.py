"""The docs' code-block convention (tests/support/doc_blocks.py): what runs, what is skipped, what is refused."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
from doc_blocks import CodeBlock, DocBlockError, DocParseError, doc_pages, parse_blocks, run_page

PAGE = Path("docs/guide.md")


def blocks_of(text: str) -> list[CodeBlock]:
    return parse_blocks(text, PAGE)


def test_python_blocks_are_found_in_order_with_the_line_of_their_first_code_line() -> None:
    text = (
        "# Title\n"                 # 1
        "\n"                        # 2
        "```python\n"               # 3
        "x = 1\n"                   # 4
        "```\n"                     # 5
        "```bash\n"                 # 6
        "rayfleet status\n"         # 7
        "```\n"                     # 8
        '```py title="two.py"\n'    # 9
        "y = x + 1\n"               # 10
        "print(y)\n"                # 11
        "```\n"                     # 12
    )
    blocks = blocks_of(text)
    assert [(block.line, block.source) for block in blocks] == [(4, "x = 1\n"), (10, "y = x + 1\nprint(y)\n")]
    assert all(block.skip_reason is None for block in blocks)
    assert blocks[1].where == "docs/guide.md:10"


def test_a_skip_marker_skips_the_next_python_block_and_keeps_its_reason() -> None:
    text = "<!-- skip: needs a GPU -->\n\n```python\nrun_on_gpu()\n```\n\n```python\nok = True\n```\n"
    skipped, ran = blocks_of(text)
    assert skipped.skip_reason == "needs a GPU"
    assert ran.skip_reason is None


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("```python\nx = 1\n", "docs/guide.md:1: the code fence ```python is never closed"),
        ("~~~python\nx = 1\n```\n", "docs/guide.md:1: the code fence ~~~python is never closed"),
        ("<!-- skip: -->\n```python\nx = 1\n```\n", "with a reason"),
        ("<!-- skip -->\n```python\nx = 1\n```\n", "with a reason"),
        ("<!-- skip: later -->\nSome prose.\n```python\nx = 1\n```\n", "docs/guide.md:1: skip marker not followed"),
        ("<!-- skip: shell -->\n```bash\nls\n```\n", "docs/guide.md:1: skip marker precedes a bash block"),
        ("text\n<!-- skip: at the end -->\n", "docs/guide.md:2: skip marker not followed"),
    ],
    ids=["unterminated", "wrong closing fence", "empty reason", "no reason", "stray marker", "non-python",
         "marker at the end"],
)
def test_a_page_breaking_the_convention_is_refused_with_its_line(text: str, complaint: str) -> None:
    with pytest.raises(DocParseError) as refused:
        blocks_of(text)
    assert complaint in str(refused.value)


def test_a_longer_fence_holds_shorter_ones_whose_python_is_not_run() -> None:
    text = "````markdown\n```python\nnot_run()\n```\n````\n```python\nrun()\n```\n"
    assert [block.source for block in blocks_of(text)] == ["run()\n"]


def test_indented_fences_in_lists_and_tabs_run_without_their_indentation() -> None:
    text = '=== "Python"\n\n    ```python\n    if True:\n        x = 1\n    ```\n'
    [block] = blocks_of(text)
    assert block.source == "if True:\n    x = 1\n"
    assert block.line == 4


def test_a_page_without_python_has_no_blocks_but_is_still_parsed() -> None:
    assert blocks_of("# Only prose\n\n```yaml\na: 1\n```\n") == []
    with pytest.raises(DocParseError):
        blocks_of("# Only prose\n\n```yaml\na: 1\n")


def test_blocks_share_one_namespace_and_top_level_await_runs(tmp_path: Path) -> None:
    text = (
        "```python\nimport asyncio\nvalues = []\n```\n"
        "```python\nawait asyncio.sleep(0)\nvalues.append(1)\n```\n"
        "<!-- skip: shows a failure -->\n```python\nraise RuntimeError('never run')\n```\n"
        "```python\nasync def twice(n):\n    return 2 * n\nvalues.append(await twice(values[0]))\n"
        "assert values == [1, 2]\nassert __name__ == '__main__'\n```\n"
    )
    blocks = blocks_of(text)
    assert run_page(blocks, root=tmp_path, script=tmp_path / "guide.py") == 3


def test_a_failing_block_is_named_by_page_and_line_and_its_traceback_shows_the_page(tmp_path: Path) -> None:
    page = tmp_path / PAGE
    page.parent.mkdir(parents=True)
    page.write_text("# Guide\n\n```python\nx = 1\n```\n\nProse.\n\n```python\ny = 2\nassert x == y, 'x is not y'\n```\n")
    blocks = blocks_of(page.read_text())
    with pytest.raises(DocBlockError) as failed:
        run_page(blocks, root=tmp_path, script=tmp_path / "guide.py")
    assert str(failed.value).startswith("docs/guide.md:10: block 2 of 2")
    assert "AssertionError: x is not y" in str(failed.value)
    frames = traceback.extract_tb(failed.value.__cause__.__traceback__)
    assert (frames[-1].filename, frames[-1].lineno) == (str(page), 11)
    assert frames[-1].line == "assert x == y, 'x is not y'"


def test_a_block_that_is_not_python_is_named_by_its_line(tmp_path: Path) -> None:
    blocks = blocks_of("```python\nok = 1\nfleet.spawn(\n```\n")
    with pytest.raises(DocBlockError, match=r"docs/guide.md:\d: not valid Python"):
        run_page(blocks, root=tmp_path, script=tmp_path / "guide.py")


def test_doc_pages_are_the_readme_and_every_page_under_docs(tmp_path: Path) -> None:
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    for name in ("README.md", "docs/index.md", "docs/guides/teams.md", "docs/notes.txt"):
        (tmp_path / name).write_text("# page\n")
    assert doc_pages(tmp_path) == [Path("README.md"), Path("docs/guides/teams.md"), Path("docs/index.md")]
