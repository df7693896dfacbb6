"""The benchmark figures of the READMEs and benchmarks/RESULTS.md are rendered from committed results
files and agree.

``python -m iac.bench.reports.figures --check`` as a test: no marked section is stale, every results file a
section names exists and describes itself, and no figure is shown two ways. No benchmark runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from iac.bench.reports import figures, figures_results

ROOT = Path(__file__).resolve().parent.parent

SECTIONS = figures.sections()


def test_every_document_has_marked_sections():
    assert {s.document for s in SECTIONS} == set(figures.DOCUMENTS)
    assert figures.ROOT / "benchmarks" / "RESULTS.md" in figures.DOCUMENTS


def test_the_readme_headline_shows_iac_against_nats_and_zeromq_bare_and_signed():
    (head,) = [s for s in SECTIONS if s.document.name == "README.md" and s.document.parent == figures.ROOT]
    assert head.name == "brokers"
    assert "| contender | encryption | per-message authentication | RTT p50" in head.rendered
    secures = {"IAC-TLS/TCP": "TLS 1.3 | Ed25519 both ways, replay check", "NATS": "none | none"}
    secures |= {"NATS+Ed25519": "none | Ed25519 both ways", "ZeroMQ": "none | none"}
    for who, what in {**secures, "ZeroMQ+Ed25519": "none | Ed25519 both ways"}.items():
        assert f"| {who} | {what} | " in head.rendered, who


@pytest.mark.parametrize("sec", SECTIONS, ids=lambda s: s.where)
def test_marked_section_is_rendered_from_its_files(sec):
    assert sec.error is None, sec.error
    assert not sec.stale, f"{sec.where} is stale: run python -m iac.bench.reports.figures"
    for source in sec.sources:  # every table names its file and the command that wrote it
        res = figures_results.load(source)
        assert f"[`{source}`]" in sec.rendered
        assert f"`{res.doc['command']}`" in " ".join(sec.rendered.split())  # a code span may wrap


def test_no_figure_is_shown_two_ways():
    assert figures.conflicts(SECTIONS) == []


def test_check_passes():
    assert figures.problems(SECTIONS) == []


def test_results_files_are_named_and_describe_themselves():
    named = {src for s in SECTIONS for src in s.sources}
    found = {str(p.relative_to(ROOT)) for p in figures_results.RESULTS.glob("*.json")}
    assert found, "no results committed"
    assert found == named, "every results file is named by a marked section, and only those"
    for path in sorted(found):
        assert figures_results.DATED.match(Path(path).name), path
        doc = json.loads((ROOT / path).read_text(encoding="utf-8"))
        assert {"command", "started", "environment"} <= set(doc), path
        env = doc["environment"]
        assert {"cpu_model", "cores", "python", "libraries", "git_commit"} <= set(env), path
        assert doc["started"][:10] == Path(path).name[:10], "the file is named with its date"
        for machine_dir in (f"/{d}/" for d in ("tmp", "home", "root", "work")):
            assert machine_dir not in json.dumps(doc), (path, machine_dir)


# --- the machinery, on documents and results of its own ----------------------------------------


def _mesh_results(root: Path, date: str, direct: float) -> str:
    path = f"benchmarks/results/{date}-benchmarks-mesh.json"
    doc = {
        "schema": figures_results.RECORD_SCHEMA,
        "command": "python -m iac.bench.scenarios.mesh --json bench-results/mesh.json",
        "started": f"{date}T00:00:00+00:00",
        "environment": {
            "cpu_model": "cpu",
            "cores": 2,
            "python": "3.11.7",
            "libraries": {},
            "git_commit": "abc",
        },
        "result": {"relay": {"direct": direct, "via_relay": direct / 2, "ratio": 0.5}},
    }
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    monkeypatch.setattr(figures_results, "ROOT", tmp_path)
    monkeypatch.setattr(figures_results, "RESULTS", tmp_path / "benchmarks" / "results")
    return tmp_path


def _doc(root: Path, name: str, *sources: str, body: str = "") -> Path:
    path = root / name
    marked = "".join(f"<!-- figures: mesh ({s}) -->\n{body}<!-- /figures -->\n\n" for s in sources)
    path.write_text(f"# {name}\n\n{marked}", encoding="utf-8")
    return path


def test_stale_section_is_found_and_rewritten(tree):
    doc = _doc(tree, "A.md", _mesh_results(tree, "2026-01-01", 1000.0), body="old\n")
    (sec,) = figures.sections([doc])
    assert sec.stale and "1,000 / 500" in sec.rendered
    assert figures.write([sec]) == [doc]
    (sec,) = figures.sections([doc])
    assert not sec.stale and figures.problems([sec]) == []
    assert "<!-- figures: mesh (benchmarks/results/2026-01-01-benchmarks-mesh.json) -->" in doc.read_text()


def test_missing_results_file_is_a_problem(tree):
    doc = _doc(tree, "A.md", "benchmarks/results/2026-01-01-benchmarks-mesh.json")
    (sec,) = figures.sections([doc])
    assert sec.error and "missing" in sec.error
    assert figures.problems([sec])


def test_two_runs_of_one_command_in_two_sections_conflict(tree):
    old, new = _mesh_results(tree, "2026-01-01", 1000.0), _mesh_results(tree, "2026-02-01", 2000.0)
    a, b = _doc(tree, "A.md", old), _doc(tree, "B.md", new)
    secs = figures.sections([a, b])
    found = figures.conflicts(secs)
    assert found and "benchmarks-mesh/relay/direct" in found[0]
    figures.retarget([a, b])  # --latest: both on the newest run
    secs = figures.sections([a, b])
    assert {s.sources[0] for s in secs} == {new}
    assert figures.conflicts(secs) == []
