"""The install commands the documents show work without kmq-dagster on the package index (it is
not published): every ``pip install`` / ``uv add`` of it names a local clone, and the example
project's pip route installs the repository (two folders up) together with the project that
depends on it, as ``[tool.uv.sources]`` tells ``uv``."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kmq-orders"
DOCUMENTS = [
    ROOT / "README.md",
    EXAMPLE / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
]
_INSTALL = re.compile(r"(?:pip install|uv add)\b[^#`\n]*")


def installs(path: Path) -> list[list[str]]:
    """The arguments of every ``pip install`` / ``uv add`` in ``path`` (comments included)."""
    return [shlex.split(m.group(0))[2:] for m in _INSTALL.finditer(path.read_text())]


def test_no_document_installs_kmq_dagster_from_the_package_index() -> None:
    from_index = [
        f"{path.relative_to(ROOT)}: {' '.join(args)}"
        for path in DOCUMENTS
        for args in installs(path)
        if any(re.fullmatch(r"kmq[-_]dagster(\[.*\])?", arg) for arg in args)
    ]
    assert from_index == []


def test_the_examples_pip_route_installs_kmq_dagster_from_the_repository() -> None:
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    assert "kmq-dagster" in project["project"]["dependencies"]
    source = project["tool"]["uv"]["sources"]["kmq-dagster"]["path"]  # "../.."

    pip_routes = [
        args
        for args in installs(EXAMPLE / "README.md")
        if "." in args  # installs the example project itself
    ]
    assert pip_routes, "the example README shows how to install it with pip"
    for args in pip_routes:
        at = args.index(".")
        assert args[at - 1] == "-e" and source in args[: at - 1], (
            f"pip install {' '.join(args)}: kmq-dagster is not on the package index, so the "
            f"route must install it from {source} (`pip install -e {source} -e .`)"
        )
