"""Flip one comparison at a time in ``kmq_dagster/core`` and see whether the unit tests notice.

Each comparison operator (``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``) in
``kmq_dagster/core/*.py`` is flipped on its own, every test of ``tests/unit`` runs against the
mutant (the files importing the mutated module first, stopping at the first failure), and the
file is put back byte for byte (and with its old modification time) before the next one, also on
Ctrl-C or SIGTERM. A mutant the tests do not kill is a boundary no test pins down: add a test, or,
if the flip cannot change behaviour, say why in a comment containing ``equivalent mutant`` on
that line or in the comment lines right above it, e.g. ``# equivalent mutant (> for >=): ...``
(such survivors are listed apart).

Usage::

    python tests/tools/flip_comparisons.py                 # every module of core/
    python tests/tools/flip_comparisons.py breaker retry   # only these modules

The last line is a JSON summary: mutants, killed, survivors, seconds.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import tokenize
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "kmq_dagster" / "core"
#: Each operator and what it is flipped to.
FLIPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}
#: Text in a line's comment that marks its comparison's flips as unable to change behaviour.
EQUIVALENT_NOTE = "equivalent mutant"
_NAMED_FLIP = re.compile(EQUIVALENT_NOTE + r" \((\S+) for (\S+)\)")
#: A mutant whose tests run longer than this is counted as killed (it hangs).
TIMEOUT_S = 120


@dataclass(frozen=True)
class Mutant:
    """One flipped operator: where it is and what it becomes."""

    path: Path
    line: int
    column: int
    operator: str

    @property
    def flipped(self) -> str:
        return FLIPS[self.operator]

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        text = lines[self.line - 1]
        end = self.column + len(self.operator)
        assert text[self.column : end] == self.operator, (self, text)
        lines[self.line - 1] = text[: self.column] + self.flipped + text[end:]
        return "".join(lines)

    def describe(self, source: str) -> str:
        text = source.splitlines()[self.line - 1].strip()
        where = f"{self.path.relative_to(ROOT)}:{self.line}"
        return f"{where}: {self.operator} -> {self.flipped}   {text}"


def find_mutants(path: Path) -> Iterator[Mutant]:
    """Every comparison operator of ``path`` (strings and comments are skipped by tokenize)."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.OP and token.string in FLIPS:
            yield Mutant(path, token.start[0], token.start[1], token.string)


def is_marked_equivalent(source: str, mutant: Mutant) -> bool:
    """Whether the comparison's line, or the comment lines right above it, say ``equivalent
    mutant``; a note of the form ``equivalent mutant (< for <=)`` covers only that flip."""
    lines = source.splitlines()
    comments = [lines[mutant.line - 1].partition("#")[2]]
    above = mutant.line - 2
    while above >= 0 and lines[above].strip().startswith("#"):
        comments.append(lines[above])
        above -= 1
    for comment in comments:
        if EQUIVALENT_NOTE not in comment:
            continue
        named = _NAMED_FLIP.search(comment)
        if named is None or named.groups() == (mutant.flipped, mutant.operator):
            return True
    return False


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def mutated(mutant: Mutant, original: bytes, stat: os.stat_result) -> Iterator[None]:
    """``mutant.path`` holds the mutant inside the block and its original bytes after it."""
    try:
        with _signals_held():
            _write(mutant.path, mutant.apply(original.decode()).encode())
            # A different mtime makes Python ignore the cached bytecode of the original
            # (same-size flips such as == to != would otherwise run the unmutated code).
            later_ns = stat.st_mtime_ns + 7_000_000_000
            os.utime(mutant.path, ns=(later_ns, later_ns))
        yield
    finally:
        with _signals_held():
            _write(mutant.path, original)
            os.utime(mutant.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is over (they then interrupt as usual)."""
    held = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def _write(path: Path, data: bytes) -> None:
    """Replace ``path`` in one step, so an interrupt never leaves half a file."""
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as temp:
        temp.write(data)
    os.replace(temp.name, path)


def unit_tests_first_for(module: str) -> list[str]:
    """Every unit test file, those importing ``core/<module>`` first: a mutant dies sooner."""
    files = sorted((ROOT / "tests" / "unit").glob("test_*.py"))
    imports = re.compile(rf"core\.{module}\b|core import (\w+, )*{module}\b")
    first = [path for path in files if imports.search(path.read_text())]
    return [str(path) for path in first + [path for path in files if path not in first]]


def tests_pass(workdir: Path, test_files: list[str]) -> bool:
    """Run ``test_files`` against the code as it is now; ``True`` if they all pass."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        *test_files,
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "--hypothesis-seed=0",
        f"--rootdir={ROOT}",
        "-c",
        str(ROOT / "pyproject.toml"),
    ]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        # A fresh working directory per run: no hypothesis database carries over between mutants.
        result = subprocess.run(
            command, cwd=workdir, env=env, capture_output=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="module names in core/, e.g. breaker")
    args = parser.parse_args(argv)
    # Also when started in the background, where SIGINT may come in ignored.
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return _run(args.modules)
    except KeyboardInterrupt:
        print("\ninterrupted; every source file is back as it was", file=sys.stderr)
        return 130


def _run(modules: list[str]) -> int:
    paths = [CORE / f"{name}.py" for name in modules] or sorted(CORE.glob("*.py"))
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        if not tests_pass(Path(scratch), unit_tests_first_for("")):
            print("the unit tests fail on the unmutated code: fix that first", file=sys.stderr)
            return 2
    per_module: dict[str, dict[str, int]] = {}
    survivors: list[str] = []
    equivalents: list[str] = []
    for path in paths:
        original = path.read_bytes()
        stat = path.stat()
        source = original.decode()
        counts = per_module.setdefault(path.stem, {"mutants": 0, "survived": 0, "equivalent": 0})
        test_files = unit_tests_first_for(path.stem)
        for mutant in find_mutants(path):
            counts["mutants"] += 1
            with tempfile.TemporaryDirectory() as scratch, mutated(mutant, original, stat):
                killed = not tests_pass(Path(scratch), test_files)
            if killed:
                continue
            if is_marked_equivalent(source, mutant):
                counts["equivalent"] += 1
                equivalents.append(mutant.describe(source))
            else:
                counts["survived"] += 1
                survivors.append(mutant.describe(source))
            print(f"survived: {mutant.describe(source)}", flush=True)
    seconds = round(time.monotonic() - started)
    print("\nper module (survived / mutants, commented equivalents apart):")
    for module, counts in per_module.items():
        if counts["mutants"]:
            extra = f" + {counts['equivalent']} equivalent" if counts["equivalent"] else ""
            print(f"  {module:14} {counts['survived']:3} / {counts['mutants']}{extra}")
    if equivalents:
        print("\nsurvivors commented as equivalent mutants:")
        print("\n".join(f"  {line}" for line in equivalents))
    print("\nsurvivors:" if survivors else "\nno survivors")
    print("\n".join(f"  {line}" for line in survivors))
    total = sum(counts["mutants"] for counts in per_module.values())
    summary = {
        "mutants": total,
        "killed": total - len(survivors) - len(equivalents),
        "equivalent": len(equivalents),
        "survivors": len(survivors),
        "seconds": seconds,
    }
    print(json.dumps(summary))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
