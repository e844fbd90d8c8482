"""README's code runs as written.

Every ```python block must compile, import what it uses and use no undefined name. Blocks
marked ``<!-- readme-test: run -->`` are run, in order, in one scratch directory, against a
fresh embedded broker; ``<!-- readme-test: file PATH -->`` writes a block there first (a handler
module the next blocks import). ```sh blocks marked ``run`` run in bash the same way, with the
embedded broker's port 9092 replaced by a free one.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kmq_dagster.broker import EmbeddedBroker
from kmq_dagster.broker.ports import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

README = Path(__file__).resolve().parents[2] / "README.md"
_BLOCK = re.compile(
    r"(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?```(?P<lang>python|sh)\n(?P<code>.*?)```",
    re.S,
)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    mark: str
    line: int

    @property
    def name(self) -> str:
        return f"README.md:{self.line} ({self.lang}{', ' + self.mark if self.mark else ''})"


def blocks() -> list[Block]:
    text = README.read_text()
    return [
        Block(m["lang"], m["code"], m["mark"] or "", text.count("\n", 0, m.start()) + 1)
        for m in _BLOCK.finditer(text)
    ]


PYTHON = [b for b in blocks() if b.lang == "python"]


@pytest.mark.parametrize("block", PYTHON, ids=[b.name for b in PYTHON])
def test_every_python_block_imports_what_it_uses_and_uses_nothing_undefined(
    block: Block, tmp_path: Path
) -> None:
    source = tmp_path / "block.py"
    source.write_text(block.code)
    compile(block.code, block.name, "exec")
    undefined = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821,F822,F823",
         "--output-format", "concise", str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert undefined.returncode == 0, f"{block.name}:\n{undefined.stdout}"
    tree = ast.parse(block.code)
    imports = "\n".join(
        ast.unparse(node) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
    )
    for module in blocks():  # the modules README asks the reader to write, e.g. myapp/...
        if module.mark.startswith("file "):
            path = tmp_path / module.mark.removeprefix("file ").strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(module.code)
    imported = subprocess.run(
        [sys.executable, "-c", imports], capture_output=True, text=True, check=False,
        cwd=tmp_path,
    )  # fmt: skip
    assert imported.returncode == 0, f"{block.name}: {imported.stderr}"


@pytest.fixture(scope="module")
def readme_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0) as broker:
        yield broker


def test_the_runnable_blocks_run_in_order(readme_broker: EmbeddedBroker, tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "KMQ_BOOTSTRAP_SERVERS": readme_broker.bootstrap_servers,
        "KMQ_SESSION_TIMEOUT_MS": "6000",
        "KMQ_AUDIT_URL": f"sqlite:///{tmp_path / 'audit.db'}",
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    ran = 0
    for block in blocks():
        if block.mark.startswith("file "):
            target = tmp_path / block.mark.removeprefix("file ").strip()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
        elif block.mark == "run" and block.lang == "python":
            script = tmp_path / f"readme_{block.line}.py"
            script.write_text(block.code)
            _run([sys.executable, str(script)], block, tmp_path, env)
            ran += 1
        elif block.mark == "run" and block.lang == "sh":
            code = block.code.replace("9092", str(port))
            _run(["bash", "-euo", "pipefail", "-c", code], block, tmp_path, env)
            ran += 1
    assert ran >= 3, "README lost its runnable examples"


def _run(argv: list[str], block: Block, cwd: Path, env: dict[str, str]) -> None:
    """Run one block in its own process group; whatever it left running is stopped after."""
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 0, (
        f"{block.name} failed ({process.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}"
    )
