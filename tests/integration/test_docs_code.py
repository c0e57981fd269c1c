"""Every Python block of README.md and docs/**/*.md runs, page by page, as a reader would run it.

One test per page (a page whose blocks are all marked ``<!-- skip: reason -->`` is still
collected, and parsed as strictly). The convention is in tests/support/doc_blocks.py.
A failure names the page and the line of the block that raised; the traceback shows
the page's own lines.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from doc_blocks import DocBlockError, doc_pages, parse_blocks, run_page
from user_scripts import REPO, UserSetting

PAGES = doc_pages(REPO)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES, ids=[str(page) for page in PAGES])
def test_the_code_of_a_docs_page_runs(page: Path, user: UserSetting, record_property: Callable[[str, object], None]) -> None:
    blocks = parse_blocks((REPO / page).read_text(encoding="utf-8"), page)
    failure = None
    try:
        ran = run_page(blocks, root=REPO, script=user.workdir / f"{page.stem}.py")
    except DocBlockError as error:
        failure = str(error)
    if failure is not None:  # outside the except block, so the report is the page's trace alone
        pytest.fail(failure, pytrace=False)
    record_property("blocks_run", ran)
    record_property("blocks_skipped", len(blocks) - ran)
