"""What a person sees of the console's tables in a real browser: cells cut at a column's
edge, columns off the screen, rows hidden behind an inner scroll bar.

Streamlit draws ``st.dataframe`` on a canvas (glide data grid): its cells' text is in an
accessible table inside the canvas, and the widths it draws with are the grid's own
``columns``; the checks measure each cell's text with the grid's font and wrap it the way a
row of that height holds it. ``st.table`` is HTML: a cell's content must not overflow it.
"""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Page

_GRIDS = r"""
() => [...document.querySelectorAll('[data-testid="data-grid-canvas"]')].map(canvas => {
  const fiberKey = Object.keys(canvas).find(k => k.startsWith('__reactFiber$'));
  let fiber = canvas[fiberKey], props = null;
  while (fiber && !props) {  // the innermost grid: the widths it draws with
    const p = fiber.memoizedProps;
    if (p && Array.isArray(p.columns) && p.columns.every(c => typeof c.width === 'number'))
      props = p;
    fiber = fiber.return;
  }
  const style = getComputedStyle(canvas.closest('.stDataFrameGlideDataEditor'));
  const font = style.getPropertyValue('--gdg-base-font-style').trim() + ' '
    + style.getPropertyValue('--gdg-font-family').trim();
  const padding = parseFloat(style.getPropertyValue('--gdg-cell-horizontal-padding')) || 8;
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = font;
  const wide = text => ctx.measureText(text).width;
  const lines = (text, room) => {  // word wrap; a word longer than a line broken inside
    let count = 1, line = '';
    for (const word of text.split(/\s+/).filter(Boolean)) {
      const joined = line ? line + ' ' + word : word;
      if (wide(joined) <= room) { line = joined; continue; }
      if (line) count += 1;
      let rest = word;
      while (wide(rest) > room) {
        let fit = 1;
        while (wide(rest.slice(0, fit + 1)) <= room) fit += 1;
        rest = rest.slice(fit);
        count += 1;
      }
      line = rest;
    }
    return count;
  };
  const scroller = canvas.closest('.stDataFrameGlideDataEditor').querySelector('.dvn-scroller');
  const titles = props.columns.map(c => c.title);
  const rowHeight = typeof props.rowHeight === 'number' ? props.rowHeight : 35;
  // lines a row holds: wrapping cells (rows over 4rem) draw lines 1.4 font sizes apart
  const size = parseFloat(style.getPropertyValue('--gdg-base-font-style').split(' ')[1]);
  const allowed = rowHeight > 64 ? Math.floor((rowHeight - 6 - size) / (1.4 * size)) + 1 : 1;
  const cut = [];
  for (const cell of canvas.querySelectorAll('tbody td')) {
    const column = props.columns[Number(cell.id.split('-')[2])];  // glide-cell-COLUMN-ROW
    const text = cell.textContent;
    if (lines(text, column.width - 2 * padding) > allowed)
      cut.push(`${column.title}: ${text} (${column.width}px)`);
  }
  return {
    titles, cut, rows: canvas.querySelectorAll('tbody tr').length,
    overflowX: scroller ? scroller.scrollWidth - scroller.clientWidth : 0,
    overflowY: scroller ? scroller.scrollHeight - scroller.clientHeight : 0,
  };
})
"""

_TABLES = r"""
() => [...document.querySelectorAll('[data-testid="stTable"]')].map(table => {
  const cut = [...table.querySelectorAll('th, td')]
    .filter(cell => cell.scrollWidth > cell.clientWidth + 1)
    .map(cell => cell.textContent);
  const box = table.getBoundingClientRect();
  const scroll = [...table.querySelectorAll('*')].find(e => e.scrollWidth > e.clientWidth + 1
    && getComputedStyle(e).overflowX !== 'visible');
  return {
    cut, offScreen: box.right > document.documentElement.clientWidth,
    scrolls: scroll ? scroll.tagName : null,
    header: [...table.querySelectorAll('thead th')].map(th => th.textContent),
  };
})
"""


def grids(page: Page) -> list[dict[str, Any]]:
    """Every data grid on the page: its column titles, its cells that do not fit their
    column (``"column: text (width)"``), the rows drawn, and how far it scrolls inside."""
    return list(page.evaluate(_GRIDS))


def tables(page: Page) -> list[dict[str, Any]]:
    """Every static table on the page: its header, cells whose content overflows them, and
    whether it runs off the screen or scrolls sideways."""
    return list(page.evaluate(_TABLES))


def assert_whole(page: Page) -> None:
    """Every table and grid on the page shows every cell whole, on screen, with no inner
    scroll bar."""
    for grid in grids(page):
        assert not grid["cut"], grid
        assert grid["overflowX"] <= 1 and grid["overflowY"] <= 1, grid
    for table in tables(page):
        assert not table["cut"] and not table["offScreen"] and not table["scrolls"], table
