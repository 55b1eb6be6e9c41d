"""What the overview draws, measured in Chromium: no text is drawn over another."""

from __future__ import annotations

from typing import Any

import pytest
from tests.web.browser.conftest import Site

pytestmark = pytest.mark.timeout(240)

TEXTS = """() => [...document.querySelectorAll('[data-testid=last-outcome]')].map(mark => {
  const cell = mark.closest('td');
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  const found = [];
  while (walker.nextNode()) {
    const node = walker.currentNode;
    if (!node.textContent.trim()) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const box = range.getBoundingClientRect();
    found.push([node.textContent.trim(), box.left, box.top, box.right, box.bottom]);
  }
  return found;
})"""


def _overlap(a: list[Any], b: list[Any]) -> bool:
    return a[1] < b[3] - 0.5 and b[1] < a[3] - 0.5 and a[2] < b[4] - 0.5 and b[2] < a[4] - 0.5


def test_the_last_slots_outcome_is_not_drawn_over_its_time(site: Site, page: Any) -> None:
    site.ok("run", "report")
    page.goto(f"{site.url}/")
    cells = page.evaluate(TEXTS)
    assert len(cells) == page.get_by_test_id("job-row").count() == 5
    for texts in cells:
        words = [t[0] for t in texts]
        assert len(words) == 2 and words[1].endswith("+00:00"), words  # outcome, then time
        assert not _overlap(texts[0], texts[1]), texts
