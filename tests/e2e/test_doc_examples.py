"""The code of README.md and of every page of the documentation site runs as written.

Every ```python block must compile, import what it uses and use no undefined name. Blocks
marked ``<!-- docs-test: run -->`` are run, in order, one page at a time, in one scratch
directory per page, against a fresh embedded broker per page; ``<!-- docs-test: file PATH -->``
writes a block there first (a handler module the blocks import; any page's file blocks are
there for every page). ```sh blocks marked ``run`` run in bash the same way, with the embedded
broker's port 9092 replaced by a free one.

A run marker may promise output, one ``expect: TEXT`` line per promise; the block's output
(stdout and stderr) must then contain each TEXT, or, for ``expect N: TEXT``, contain TEXT on
exactly N lines::

    <!-- docs-test: run
    expect: charged 2
    expect 2: dead letter
    -->
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from kmq_dagster.broker import EmbeddedBroker
from kmq_dagster.broker.ports import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(
    r"(?:<!-- docs-test: (?P<mark>[^>]*?)-->\n)?```(?P<lang>python|sh)\n(?P<code>.*?)```",
    re.S,
)
_EXPECT = re.compile(r"^expect(?: (?P<count>\d+))?: (?P<text>.+)$", re.M)


@dataclass(frozen=True)
class Block:
    document: str
    lang: str
    code: str
    mark: str
    line: int

    @property
    def action(self) -> str:
        """``run``, ``file PATH`` or ``""``: the marker's first line."""
        return self.mark.strip().split("\n", 1)[0].strip()

    @property
    def expected(self) -> list[tuple[int | None, str]]:
        """The output the block promises: (exact line count or None, text)."""
        return [
            (int(m["count"]) if m["count"] else None, m["text"].strip())
            for m in _EXPECT.finditer(self.mark)
        ]

    @property
    def name(self) -> str:
        action = f", {self.action}" if self.action else ""
        return f"{self.document}:{self.line} ({self.lang}{action})"


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    name = str(path.relative_to(ROOT))
    return [
        Block(name, m["lang"], m["code"], m["mark"] or "", text.count("\n", 0, m.start()) + 1)
        for m in _BLOCK.finditer(text)
    ]


ALL = [block for document in DOCUMENTS for block in blocks(document)]
PYTHON = [b for b in ALL if b.lang == "python"]
FILES = [b for b in ALL if b.action.startswith("file ")]
RUNNABLE = sorted({b.document for b in ALL if b.action == "run"})


def _write_files(directory: Path) -> None:
    """The modules the documentation asks the reader to write, e.g. myapp/pricing.py."""
    for block in FILES:
        path = directory / block.action.removeprefix("file ").strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.code)


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
    _write_files(tmp_path)
    imported = subprocess.run(
        [sys.executable, "-c", imports], capture_output=True, text=True, check=False,
        cwd=tmp_path,
    )  # fmt: skip
    assert imported.returncode == 0, f"{block.name}: {imported.stderr}"


def test_the_documentation_has_runnable_examples_and_keeps_its_promises() -> None:
    assert "README.md" in RUNNABLE and len(RUNNABLE) >= 3, RUNNABLE
    assert sum(len(b.expected) for b in ALL) >= 5, "the examples lost their promised output"


@pytest.fixture
def page_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0) as broker:
        yield broker


@pytest.mark.parametrize("document", RUNNABLE)
def test_the_runnable_blocks_of_a_page_run_in_order_and_print_what_they_promise(
    document: str, page_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "KMQ_BOOTSTRAP_SERVERS": page_broker.bootstrap_servers,
        "KMQ_SESSION_TIMEOUT_MS": "6000",
        "KMQ_AUDIT_URL": f"sqlite:///{tmp_path / 'audit.db'}",
        "HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    _write_files(tmp_path)
    for block in blocks(ROOT / document):
        if block.action == "run" and block.lang == "python":
            script = tmp_path / f"block_{block.line}.py"
            script.write_text(block.code)
            output = _run([sys.executable, str(script)], block, tmp_path, env)
        elif block.action == "run" and block.lang == "sh":
            code = block.code.replace("9092", str(port))
            output = _run(["bash", "-euo", "pipefail", "-c", code], block, tmp_path, env)
        else:
            continue
        for count, text in block.expected:
            lines = [line for line in output.splitlines() if text in line]
            if count is None:
                assert lines, f"{block.name} promised {text!r}; it printed:\n{output[-3000:]}"
            else:
                assert len(lines) == count, (
                    f"{block.name} promised {count} lines with {text!r}, got {len(lines)}:\n"
                    + "\n".join(lines)
                )


def _run(argv: list[str], block: Block, cwd: Path, env: dict[str, str]) -> str:
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
    return stdout + stderr


def _kmq_command_lines(block: Block) -> list[list[str]]:
    """The ``kmq ...`` commands of a shell block, as argv (redirections and comments dropped)."""
    found: list[list[str]] = []
    for line in block.code.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("#"):
            continue
        for part in re.split(r"&&|\|\||;|\||&(?!\w)", line.split(" #")[0]):
            words = shlex.split(part)
            if words[:1] != ["kmq"]:
                continue
            argv: list[str] = []
            skip = False
            for word in words[1:]:
                if skip:
                    skip = False
                elif re.fullmatch(r"\d?>>?(&\d)?", word):
                    skip = not word.endswith(("&1", "&2"))
                elif not re.match(r"\d?>", word):
                    argv.append(word)
            found.append(argv)
    return found


SHELL_COMMANDS = [
    (block.name, argv) for block in ALL if block.lang == "sh" for argv in _kmq_command_lines(block)
]


@pytest.mark.parametrize(("where", "argv"), SHELL_COMMANDS, ids=[n for n, _ in SHELL_COMMANDS])
def test_every_kmq_command_the_documentation_shows_names_real_commands_and_options(
    where: str, argv: list[str]
) -> None:
    """Blocks that cannot run here (a cluster, a path under /data) are still parsed the way
    ``kmq`` parses them: every command and option must exist, and every value an option's
    type checks must be valid (values a command checks when it runs are not)."""
    from kmq_dagster.cli import cli

    command: click.Command = cli
    args, name, parent = list(argv), "kmq", None
    while True:
        context = command.make_context(name, args, parent=parent)
        if not isinstance(command, click.Group):
            break
        rest = [*getattr(context, "_protected_args", []), *context.args]
        if not rest and command.invoke_without_command:
            break  # e.g. `kmq console`: a group that is also a command
        assert rest, f"{where}: `kmq {' '.join(argv)}` names no command"
        found_name, found, args = command.resolve_command(context, rest)
        assert found is not None and found_name, f"{where}: no command {found_name!r}"
        command, parent, name = found, context, found_name
