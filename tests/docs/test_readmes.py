"""What a newcomer reads first stays true: the READMEs point at files and sections that exist,
and a time or rate the README or a guide gives as measured says on what machine, or is a range.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READMES = [ROOT / "README.md", ROOT / "ui" / "README.md"]
#: Where a newcomer reads figures: the README, the getting-started pages and the guides.
FIGURE_PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs" / "getting-started").glob("*.md")),
    *sorted((ROOT / "docs" / "guides").glob("*.md")),
]

_LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)#\s]+)")
_SECTION = re.compile(r"the ([A-Z][\w ]*?) section of (?:the (?:repository's )?)?README")
_HEADING = re.compile(r"^#+\s+(.*?)\s*$", re.MULTILINE)

_NUMBER = r"(?:\d[\d,.]*|a|one|two|three|four|five|ten|fifteen|twenty|thirty|forty|sixty)"
_UNIT = r"(?:ms|s|seconds?|min|minutes?|h|hours?|msg/s|messages/s|/s|MB/s)"
#: A figure given as measured: "about 40 s", "~33 s", "takes 8 s", "took 4.6 s", "measured in
#: two runs: open 46 s".
_MEASURED = re.compile(
    rf"(?:\babout|~|\broughly|\baround|\btakes|\btook)\s*{_NUMBER}[ -]?{_UNIT}(?![\w/])"
    rf"|\bmeasured\b[^.]*?\d[ -]?{_UNIT}(?![\w/])",
    re.IGNORECASE,
)
#: What makes such a figure honest: the machine it came from, or a range.
_MACHINE = re.compile(r"\bcores?\b|\bCPUs?\b|\bmachine\b|\blaptop\b", re.IGNORECASE)
_RANGE = re.compile(rf"\d[\d,.]*\s*(?:-|\u2013|to)\s*\d[\d,.]*\s*{_UNIT}")


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("readme", READMES, ids=_relative)
def test_a_readme_links_only_to_files_and_sections_that_exist(readme: Path) -> None:
    text = readme.read_text()
    missing = [t for t in _LINK.findall(text) if not (readme.parent / t).exists()]
    assert not missing, f"{_relative(readme)} links to missing files: {missing}"
    headings = set(_HEADING.findall((ROOT / "README.md").read_text()))
    sections = _SECTION.findall(" ".join(text.split()))
    assert not [s for s in sections if s not in headings], (
        f"{_relative(readme)} names README sections that do not exist: {sections}"
    )


def _sentences(page: Path) -> list[str]:
    """The page's prose as sentences (code blocks left out: a transcript is not a claim); a
    table belongs to the sentence that introduces it ("... on 2 cores; three runs:")."""
    prose = re.sub(r"```.*?```", " ", page.read_text(), flags=re.DOTALL)
    prose = re.sub(r"\n\s*\n(?=\|)", "\n", prose)
    return re.split(r"(?<=[.!?:;])\s+(?=[A-Z(`*])|\n\s*\n", " ".join(prose.split(" ")))


def bare(sentence: str) -> bool:
    """Whether ``sentence`` gives a measured figure with neither its machine nor a range."""
    return bool(_MEASURED.search(sentence)) and not (
        _MACHINE.search(sentence) or _RANGE.search(sentence)
    )


def test_the_check_catches_a_bare_figure_and_passes_an_honest_one() -> None:
    assert bare("It runs the whole pipeline once (about 40 s): it starts the broker.")
    assert bare("The breaker opens at ~33 s.")
    assert bare("The suite takes about fifteen minutes.")
    assert bare("Measured in two runs: open 46 s and 45 s after the start.")
    assert not bare("It runs once (40-60 s on 2 cores, measured 2026-11-27).")
    assert not bare("about 40 s on a 2-core machine")
    assert not bare("every 10 s, a visibility timeout of 30 s")  # settings, not measurements


@pytest.mark.parametrize("page", FIGURE_PAGES, ids=_relative)
def test_every_measured_time_or_rate_says_on_what_machine_or_is_a_range(page: Path) -> None:
    found = [" ".join(s.split())[:200] for s in _sentences(page) if bare(s)]
    assert not found, f"{_relative(page)}: figures without a machine or a range: {found}"
