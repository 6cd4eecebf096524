"""The tests that README and docs cite exist, and security.md's threats are shown by default tests.

A claim in the docs names the test that shows it (`tests/x/test_y.py::test_name`, or `::test_name`
after a file already named). This module reads every Markdown file and checks that each cited file
exists and defines each cited test; for `docs/security.md` it also checks that every threat row names
at least one test of the default suite (not marked `slow`). Pure: reads files only.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

# `tests/a/test_b.py`, optionally followed by `::test_c[param]`; then `::test_d` continuations.
_FILE = re.compile(r"(tests/[\w/]+\.py)((?:::[\w]+(?:\[[^\]`]*\])?)?)")
_CONTINUATION = re.compile(r"`::(\w+)")


def citations(text: str) -> list[tuple[str, str | None]]:
    """(file, test name or None) for each citation, in order; `::name` refers to the last file."""
    found: list[tuple[int, str, str | None]] = []
    for m in _FILE.finditer(text):
        name = m.group(2)[2:].split("[")[0] if m.group(2) else None
        found.append((m.start(), m.group(1), name))
    files = list(found)
    for m in _CONTINUATION.finditer(text):
        before = [f for pos, f, _ in files if pos < m.start()]
        if before:
            found.append((m.start(), before[-1], m.group(1)))
    return [(f, n) for _, f, n in sorted(found)]


@cache
def _tests_in(path: Path) -> dict[str, bool]:
    """Test function name -> whether it is marked slow (itself or by the module's pytestmark)."""
    tree = ast.parse(path.read_text())
    module_slow = any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        and "slow" in ast.unparse(node.value)
        for node in tree.body
    )
    out: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            marks = " ".join(ast.unparse(d) for d in node.decorator_list)
            out[node.name] = module_slow or "mark.slow" in marks
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_cited_test_exists(doc: Path) -> None:
    missing = []
    for file, name in citations(doc.read_text()):
        path = ROOT / file
        if not path.exists():
            missing.append(file)
        elif name is not None and name not in _tests_in(path):
            missing.append(f"{file}::{name}")
    assert not missing, f"{doc.name} cites tests that do not exist: {sorted(set(missing))}"


def _threat_rows() -> list[str]:
    text = (ROOT / "docs" / "security.md").read_text()
    table = text.split("| threat |", 1)[1].split("\n\n", 1)[0]
    return [row for row in table.splitlines()[2:] if row.startswith("|")]


def test_security_threats_each_name_a_default_suite_test() -> None:
    rows = _threat_rows()
    assert len(rows) >= 10, "docs/security.md lost its threat table"
    unshown = []
    for row in rows:
        shown = [
            (file, name)
            for file, name in citations(row)
            if (ROOT / file).exists() and (name is None or not _tests_in(ROOT / file).get(name, True))
        ]
        if not shown:
            unshown.append(row.split("|")[1].strip())
    assert not unshown, f"threat rows without a default-suite test: {unshown}"


def test_citation_parser_reads_continuations() -> None:
    text = "see `tests/a/test_b.py::test_one[x]`, `::test_two`, `tests/c/test_d.py`, `::test_three`"
    assert citations(text) == [
        ("tests/a/test_b.py", "test_one"),
        ("tests/a/test_b.py", "test_two"),
        ("tests/c/test_d.py", None),
        ("tests/c/test_d.py", "test_three"),
    ]
