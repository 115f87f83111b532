"""Numbers from files: every marked table and figure in README.md, docs/*.md and
benchmarks/README.md is what `benchmarks/tables.py` generates from benchmarks/results/. A table
or figure edited by hand, or a results file changed without regenerating the text, fails here."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import tables  # noqa: E402


@pytest.mark.parametrize("doc", tables.DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_marked_table_and_figure_matches_its_results_file(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    assert tables.differences(text) == [], "run: python benchmarks/tables.py"


def test_the_readmes_mark_the_tables_that_come_from_results_files() -> None:
    marked = {m.group(2) for d in tables.DOCS for m in tables.TABLE.finditer(d.read_text())}
    assert marked == set(tables.TABLES)  # every table is in a document, and only known ones
    readme = (ROOT / "README.md").read_text()
    assert len(tables.FIG.findall(readme)) >= 6  # the quick start's result
    assert len(tables.FIG.findall((ROOT / "docs" / "quickstart.md").read_text())) >= 6
    # the whole measurement, both runs: docs/benchmarks.md
    assert len(tables.FIG.findall((ROOT / "docs" / "benchmarks.md").read_text())) >= 12


def test_every_docs_page_is_checked() -> None:
    pages = set((ROOT / "docs").glob("*.md"))
    assert pages and pages <= set(tables.DOCS)


def test_a_hand_edited_table_or_figure_is_caught(tmp_path: Path) -> None:
    text = (ROOT / "benchmarks" / "README.md").read_text()
    block = tables.TABLE.search(text.split("<!-- table:probation -->")[0] + text[
        text.index("<!-- table:probation -->"):])  # fmt: skip
    assert block is not None
    edited = text.replace("| 42 |", "| 41 |", 1)  # the probation median, typed by hand
    assert edited != text and tables.differences(edited) == ["table:probation"]
    readme = (ROOT / "README.md").read_text()
    wrong = readme.replace("-->0.350<!-- /fig -->", "-->0.360<!-- /fig -->", 1)
    (found,) = tables.differences(wrong)
    assert "0.360" in found and "0.350" in found


def test_a_changed_results_file_changes_the_table(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results)
    text = (ROOT / "benchmarks" / "README.md").read_text()
    assert tables.differences(text, results) == []
    saved = json.loads((results / "probation.json").read_text())
    first = next(iter(saved["settings"]))
    saved["settings"][first]["median"] = 99.0
    (results / "probation.json").write_text(json.dumps(saved))
    assert tables.differences(text, results) == ["table:probation"]
    assert "| 99 |" in tables.render(text, results)


def test_figure_reads_paths_and_formats_intervals(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps({"a": {"b": [0.1234, 0.5678]}, "n": [3, 4]}))
    assert tables.figure(tmp_path, "r.json", "a.b", ".2f") == "0.12–0.57"
    assert tables.figure(tmp_path, "r.json", "n.1", "d") == "4"
    text = "x <!-- fig:r.json#a.b.0|.3f -->9<!-- /fig --> y"
    assert tables.render(text, tmp_path) == "x <!-- fig:r.json#a.b.0|.3f -->0.123<!-- /fig --> y"
