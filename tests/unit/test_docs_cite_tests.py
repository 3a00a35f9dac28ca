"""Every test the docs cite exists. Each `tests/<file>.py` named in docs/*.md or README.md is a
file of the repository, and each `tests/<file>.py::<name>` (a `[param]` after it allowed), or
`::<name>` standing for a test of the file cited last before it in the same document, is a
function or class that file defines at module level, or a method of one of its classes
(`::Class::method` names that method exactly). Read with ast, nothing imported: a test
renamed, moved or deleted while a promise still cites it fails here."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from ..conftest import ROOT

DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

# A file cited with its path, perhaps followed by `::name` (or `::Class::name`); or a bare
# `::name` continuing the file cited last. A `[param]` after either is the test's parameter.
CITATION = re.compile(
    r"(?P<file>tests/[\w/]+\.py)(?:::(?P<names>[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*))?"
    r"|(?<![\w:])::(?P<more>[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)"
)


def citations(text: str) -> Iterator[tuple[int, str | None, str | None]]:
    """(line, file, names) for each citation in a document, in order; a bare `::name` gets
    the file cited last before it (None when there is none)."""
    last: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        for found in CITATION.finditer(line):
            if found["file"]:
                last = found["file"]
                yield number, last, found["names"]
            else:
                yield number, last, found["more"]


@cache
def defined(path: Path) -> frozenset[str]:
    """What `path` defines that a citation may name: its module-level functions and
    classes, each method by its own name and as `Class::method`."""
    names: set[str] = set()
    for node in ast.parse(path.read_text("utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                    names |= {member.name, f"{node.name}::{member.name}"}
    return frozenset(names)


def broken(text: str, root: Path) -> list[str]:
    """Each citation in `text` that names no file under `root`, or no test of that file."""
    found = []
    for line, file, names in citations(text):
        cited = f"{file or ''}{'::' + names if names else ''}"
        if file is None:
            found.append(f"line {line}: `{cited}` follows no citation of a test file")
        elif not (root / file).is_file():
            found.append(f"line {line}: `{cited}`: there is no {file}")
        elif names and names not in defined(root / file):
            found.append(f"line {line}: `{cited}`: {file} defines no {names}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_every_test_a_document_cites_exists(doc: Path) -> None:
    """Every test file and test a document cites is there, under the name it gives."""
    assert broken(doc.read_text("utf-8"), ROOT) == []


def test_a_citation_of_a_missing_file_or_test_is_found(tmp_path: Path) -> None:
    """The check itself: a missing file, a missing test (cited in full, as `::name` after
    its file, with a parameter, or as a class's method) and a bare `::name` with no file
    before it are each reported; the tests that exist are not."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test_here(): pass\n"
        "class TestGroup:\n"
        "    def test_in_class(self): pass\n"
        "def outer():\n"
        "    def test_nested(): pass\n"
    )
    doc = (
        "`::test_orphan` before any file.\n"
        "`tests/test_x.py`, `tests/test_x.py::test_here[sqlite]`, `::test_in_class`,\n"
        "`tests/test_x.py::TestGroup::test_in_class`, `::TestGroup`.\n"
        "`tests/test_x.py::test_gone`, `::test_nested`, `::test_also_gone[postgres-8]`,\n"
        "`tests/test_x.py::TestGroup::test_here`, `tests/test_y.py::test_here`.\n"
    )
    assert broken(doc, tmp_path) == [
        "line 1: `::test_orphan` follows no citation of a test file",
        "line 4: `tests/test_x.py::test_gone`: tests/test_x.py defines no test_gone",
        "line 4: `tests/test_x.py::test_nested`: tests/test_x.py defines no test_nested",
        "line 4: `tests/test_x.py::test_also_gone`: tests/test_x.py defines no test_also_gone",
        "line 5: `tests/test_x.py::TestGroup::test_here`: tests/test_x.py defines no "
        "TestGroup::test_here",
        "line 5: `tests/test_y.py::test_here`: there is no tests/test_y.py",
    ]
