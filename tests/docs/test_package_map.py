"""The package map in docs/design.md says what each part of ``kmq_dagster`` imports: held here
against the code's own imports (at module level, in functions and for type hints alike), both
ways, so the map can neither miss an import nor keep one that is gone; and no two files import
each other, directly or around a circle."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "kmq_dagster"
DESIGN = REPO / "docs" / "design.md"


def module_of(path: Path) -> str:
    """``kmq_dagster.audit.store`` for ``kmq_dagster/audit/store.py`` (packages: their name)."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """True if ``kmq_dagster.x.y`` names a file or package of the repository."""
    path = REPO / name.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").exists()


def imported_modules(path: Path) -> Iterator[str]:
    """The ``kmq_dagster`` modules ``path`` imports, wherever the import stands; ``from M
    import N`` counts ``M.N`` when N is a module of its own, else ``M``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{alias.name}"
                if (REPO / f"{node.module}.{alias.name}".replace(".", "/")).exists()
                or (REPO / f"{node.module}.{alias.name}".replace(".", "/"))
                .with_suffix(".py")
                .exists()
                else node.module
                for alias in node.names
            ]
        else:
            continue
        yield from (name for name in names if name.startswith("kmq_dagster."))


def part_of(module: str) -> str:
    """The row of the map a module belongs to: ``audit`` for ``kmq_dagster.audit.store``,
    ``errors`` for ``kmq_dagster.errors``, ``__init__`` for the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_by_part() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        part = part_of(module_of(path))
        others = {part_of(m) for m in imported_modules(path)} - {part}
        found.setdefault(part, set()).update(others)
    return found


def documented_imports() -> dict[str, set[str]]:
    """Rows of the map: the part (``audit/``, ``errors.py``) and the parts in backticks in its
    last column (words in parentheses say why, and are not parts)."""
    text = DESIGN.read_text()
    section = text[text.index("## Package map") :]
    section = section[: section.index("\n## ", 1)]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        part = cells[0].strip("`").removesuffix("/").removesuffix(".py")
        imports = re.sub(r"\([^)]*\)", "", cells[2])
        rows[part] = set(re.findall(r"`([^`]+)`", imports))
    return rows


def test_the_package_map_names_every_part_and_what_it_imports() -> None:
    documented = documented_imports()
    actual = imports_by_part()
    assert sorted(documented) == sorted(actual), "parts missing from or extra in the map"
    wrong = {
        part: {
            "imported, not in the map": sorted(actual[part] - documented[part]),
            "in the map, not imported": sorted(documented[part] - actual[part]),
        }
        for part in actual
        if actual[part] != documented[part]
    }
    assert not wrong, f"docs/design.md's package map disagrees with the imports: {wrong}"


def test_no_two_files_import_each_other_even_around_a_circle() -> None:
    modules = {module_of(path): path for path in PACKAGE.rglob("*.py")}
    graph = {
        name: {m for m in imported_modules(path) if m in modules and m != name}
        for name, path in modules.items()
        if name != "kmq_dagster"  # the public API imports lazily, on first use
    }
    circles: list[list[str]] = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circles.append([*trail[trail.index(name) :], name])
            return
        if name in done:
            return
        for other in sorted(graph.get(name, ())):
            visit(other, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)
