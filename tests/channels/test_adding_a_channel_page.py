"""docs/adding-a-channel.md shows the worked example's code as it is: each Python block on the
page is a part of FakeChat (tests/support/fakechat/), of its kit or of the contract, written as
there, so the page can't drift from the code the contract suite runs."""

from __future__ import annotations

import pytest

from tests.support.docs_examples import ROOT, blocks, page

pytestmark = pytest.mark.unit  # no Redis, no server: tests/conftest.py runs these last

SOURCES = [
    *sorted((ROOT / "tests" / "support" / "fakechat").glob("*.py")),
    ROOT / "tests" / "channels" / "fakechat" / "kit.py",
    ROOT / "tests" / "channels" / "test_contract.py",
]


def test_each_python_block_on_the_page_is_the_worked_examples_code_as_written() -> None:
    shown = blocks(page("adding-a-channel.md"), "python")
    sources = {path: path.read_text() for path in SOURCES}
    assert len(shown) >= 5
    for block in shown:
        assert any(block in text for text in sources.values()), f"not in the code:\n{block}"
