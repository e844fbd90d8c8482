"""The documentation site builds strictly and its reference pages name everything there is.

The reference is partly generated (the `kmq` options from the click commands, the Python API
from the docstrings); what is written by hand is checked here against the code, so a new
header, variable or public name cannot go undocumented.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kmq_dagster
import kmq_dagster.defs

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

#: Variables only the benchmarks' own child processes read: not user configuration.
INTERNAL_VARIABLES = {
    "KMQ_FAULT_DIR",
    "KMQ_FAULT_FAILURE_RATE",
    "KMQ_FAULT_KEEP",
    "KMQ_FAULT_WORK_MS",
}


def test_the_site_builds_strictly_with_no_broken_link_or_reference(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, check=False, env={"NO_MKDOCS_2_WARNING": "1",
        "PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    assert (
        (tmp_path / "site" / "reference" / "cli" / "index.html").read_text().count("kmq worker")
    ), "the generated kmq reference lost its commands"


def _source_strings(pattern: str, package: str = "kmq_dagster") -> set[str]:
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        if "bench" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.update(re.findall(pattern, node.value))
    return found


def test_every_kmq_header_the_code_writes_is_in_the_headers_reference() -> None:
    page = (DOCS / "reference" / "headers.md").read_text()
    # The protocol's headers are all defined in core/, next to the code that reads them.
    headers = _source_strings(r"^kmq-[a-z]+(?:-[a-z]+)+$", "kmq_dagster/core")
    assert len(headers) >= 10, headers
    missing = sorted(h for h in headers if f"`{h}`" not in page)
    assert not missing, f"headers written by the code but not documented: {missing}"


def test_every_kmq_variable_the_code_reads_is_in_the_configuration_reference() -> None:
    page = (DOCS / "reference" / "configuration.md").read_text()
    variables = _source_strings(r"\bKMQ_[A-Z0-9_]*[A-Z0-9]\b")
    variables -= INTERNAL_VARIABLES | {"KMQ_HEADER_PREFIX"}
    missing = sorted(v for v in variables if v not in page)
    assert not missing, f"variables read by the code but not documented: {missing}"


@pytest.mark.parametrize("module", [kmq_dagster, kmq_dagster.defs], ids=lambda m: m.__name__)
def test_every_public_name_is_in_the_python_api_reference(module: object) -> None:
    page = (DOCS / "reference" / "api.md").read_text()
    documented = set(re.findall(r"^::: [\w.]+\.(\w+)$", page, re.M))
    errors = {n for n in dir(kmq_dagster.errors) if n.endswith("Error")}
    public = set(getattr(module, "__all__")) - {"__version__"} - errors  # noqa: B009
    missing = sorted(public - documented)
    assert not missing, f"public names without an API entry: {missing}"


def test_every_relative_link_in_readme_points_to_a_file_that_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((?!https?://|#)([^)#\s]+)", readme)
    assert targets, "README links into the documentation"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"
