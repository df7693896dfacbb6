"""The fuzz targets in their short form, and what the fuzzers found.

* every input of the committed corpus (``tests/fuzz/corpus/<target>/``: the seeds made from the
  test vectors and every input that once broke a bound) and the seeds the current vectors make
  go through every target, held to the bounds of :mod:`tests.fuzz.bounds`;
* each target runs under atheris for a fixed number of inputs (``FUZZ_RUNS``, a fixed seed;
  ``IAC_FUZZ_SEED`` picks another), all targets at once in their own processes (skipped where
  atheris is not installed; the replay needs no fuzzer);
* no handler in the modules the targets reach catches every exception to raise a typed error;
* one regression test per finding.

``make fuzz`` runs the targets for longer (see ``tests/fuzz/__init__.py``).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from iac.protocol.routing import MAX_PATH, RelayPolicy, Router, RouteRefusal, parse_forward, wrap_forward
from iac.transport.session import DictState
from iac.wire._pb.iac_pb2 import Dict, Hello
from iac.wire.identity import Identity
from tests.fuzz.bounds import Checked, MiB
from tests.fuzz.common import CORPUS, ROOT, FuzzedDataProvider, Layout, PyDataProvider
from tests.fuzz.instrument import INSTRUMENT
from tests.fuzz.seeds import seed_files
from tests.fuzz.targets import TARGETS
from tests.fuzz.targets import dicts as dict_target

#: Inputs per target under atheris in the test suite (after the corpus).
FUZZ_RUNS = {
    "frames": 1500,
    "message": 3000,
    "hello": 2000,
    "forward": 2000,
    "records": 3000,
    "files": 400,
    "dict": 2000,
}


needs_atheris = pytest.mark.skipif(
    importlib.util.find_spec("atheris") is None, reason="atheris is not installed (dev extras, Linux x86-64)"
)


def _corpus(target: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((CORPUS / target).iterdir()) if p.is_file()}


def test_every_target_has_a_corpus_and_coverage_modules() -> None:
    assert set(TARGETS) == set(INSTRUMENT)
    for name in TARGETS:
        files = _corpus(name)
        assert any(f.startswith("seed-") for f in files), name


def test_layout_is_how_the_data_provider_reads() -> None:
    rnd = random.Random(7)
    for _ in range(500):
        spec = []
        out = Layout()
        for _ in range(rnd.randint(0, 6)):
            lo = rnd.randint(0, 9)
            hi = lo + rnd.choice([0, 1, 15, 255, 256, 65535, 2**32 - 1, rnd.randint(0, 10**9)])
            value = rnd.randint(lo, hi)
            spec.append((value, lo, hi))
            out.int(value, lo, hi)
        front = rnd.randbytes(rnd.randint(0, 40))
        fdp = PyDataProvider(out.bytes(front).build())
        assert [fdp.ConsumeIntInRange(lo, hi) for _, lo, hi in spec] == [v for v, _, _ in spec]
        assert fdp.ConsumeBytes(fdp.remaining_bytes()) == front


@needs_atheris
def test_the_python_reader_reads_as_atheris_does() -> None:
    rnd = random.Random(3)
    for _ in range(3000):
        data = rnd.randbytes(rnd.randint(0, 24))
        fast, ours = FuzzedDataProvider(data), PyDataProvider(data)
        for _ in range(rnd.randint(0, 8)):
            if rnd.random() < 0.6:
                lo = rnd.randint(0, 9)
                hi = lo + rnd.choice([0, 1, 255, 256, 65536, 2**32 - 1, 2**64 - 1, rnd.randint(0, 10**12)])
                assert fast.ConsumeIntInRange(lo, hi) == ours.ConsumeIntInRange(lo, hi), data
            else:
                n = rnd.randint(0, 12)
                assert fast.ConsumeBytes(n) == ours.ConsumeBytes(n), data
            assert fast.remaining_bytes() == ours.remaining_bytes()


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_seeds_read_back_as_built(target: str) -> None:
    module = TARGETS[target].module
    for name, data in seed_files(target).items():
        plan = module.parse(data)
        assert module.layout(plan) == data, name


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_corpus_replays_within_bounds(target: str) -> None:
    t = TARGETS[target]
    checked = Checked(t.run, t.allowed, warmup=0)
    inputs = {**_corpus(target), **{f"{n} (current vectors)": d for n, d in seed_files(target).items()}}
    for name, data in inputs.items():
        try:
            checked(data)
        except Exception as exc:
            raise AssertionError(f"{target}: {name}: {type(exc).__name__}: {exc}") from exc
    assert checked.stats.inputs == len(inputs)


@pytest.fixture(scope="module")
def fuzz_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """Every selected target under atheris at once, each in its own process."""
    prefix = "test_fuzz_target_runs_within_bounds["
    selected = [i.name[len(prefix) : -1] for i in request.session.items if i.name.startswith(prefix)]
    seed = os.environ.get("IAC_FUZZ_SEED", "1")
    procs = {}
    for name in selected:
        work = tmp_path_factory.mktemp(f"fuzz-{name}")
        (work / "new").mkdir()
        cmd = [
            sys.executable,
            "-m",
            "tests.fuzz.run",
            name,
            f"-runs={FUZZ_RUNS[name]}",
            f"-seed={seed}",
            f"-artifact_prefix={work}/",
            "-print_final_stats=0",
            # libFuzzer re-reads its output directory once a second and reruns what it finds
            # there that is no longer in its corpus (inputs it replaced by shorter ones): on a
            # slow machine that adds runs beyond -runs. Nothing else writes there: no reload.
            "-reload=0",
            str(work / "new"),
            str(CORPUS / name),
        ]
        procs[name] = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_atheris
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target_runs_within_bounds(target: str, fuzz_runs: dict[str, subprocess.Popen[str]]) -> None:
    proc = fuzz_runs[target]
    out, _ = proc.communicate(timeout=240)
    lines = [line for line in out.splitlines() if "Instrumenting" not in line]
    report = [line for line in lines if line.startswith("iac-fuzz:")]
    assert proc.returncode == 0 and report, "\n".join(lines[-40:])
    assert report[0].startswith(f"iac-fuzz: {target}: {FUZZ_RUNS[target]} inputs"), report


# --- no catch-all ---------------------------------------------------------------------------------


def _reached_files() -> list[Path]:
    files: set[Path] = set()
    for modules in INSTRUMENT.values():
        for module in modules:
            base = ROOT.joinpath(*module.split("."))
            files.update(base.rglob("*.py") if base.is_dir() else [base.with_suffix(".py")])
    return sorted(files)


def _catch_alls(path: Path) -> list[int]:
    """Lines of handlers that catch every exception (bare, Exception, BaseException) and raise a new one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ExceptHandler):
            continue
        caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
        if not any(
            c is None or (isinstance(c, ast.Name) and c.id in ("Exception", "BaseException")) for c in caught
        ):
            continue
        if any(isinstance(n, ast.Raise) and n.exc is not None for stmt in node.body for n in ast.walk(stmt)):
            found.append(node.lineno)
    return found


@pytest.mark.parametrize(
    "path",
    _reached_files(),
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_no_catch_all_turns_an_exception_into_a_typed_error(path: Path) -> None:
    assert _catch_alls(path) == [], f"{path.relative_to(ROOT)}: lines {_catch_alls(path)}"


# --- findings -------------------------------------------------------------------------------------


def test_router_does_not_relay_a_forward_whose_path_is_full() -> None:
    """A neighbour could send a broadcast (or a unicast to relay) whose path already holds MAX_PATH
    ids: ``on_forward`` raised ConfigError from ``wrap_forward`` instead of answering with a decision.
    Found by the ``forward`` target (tests/fuzz/corpus/forward/seed-broadcast-full-path)."""
    mesh = json.loads((ROOT / "proto" / "testvectors" / "mesh-v1.json").read_text(encoding="utf-8"))
    origin, relay, receiver = (mesh["agents"][role]["agent_id"] for role in ("origin", "relay", "receiver"))
    other = Identity.from_seed(b"\x44" * 32).agent_id
    peers = {origin, relay, receiver, other}
    between = [Identity.from_seed(bytes([0x80 + i]) * 32).agent_id for i in range(MAX_PATH - 2)]
    now = mesh["time_us"]

    broadcast = bytes.fromhex(mesh["forward"][0]["message_hex"])
    full = wrap_forward(broadcast, 16, [origin, *between, relay])
    router = Router(receiver)
    dec = router.on_forward(full, relay, peers, now)
    assert dec.deliver and dec.sends == () and dec.refusal is None
    assert router.stats.flood_ends == 1

    unicast = bytes.fromhex(mesh["forward"][2]["message_hex"])  # origin -> receiver
    dec = Router(relay, RelayPolicy(relay_unicast=True)).on_forward(
        wrap_forward(unicast, 8, [origin, *between, other]), other, peers, now
    )
    assert dec.refusal is RouteRefusal.HOP_LIMIT_EXHAUSTED and dec.sends == ()

    # One id short of full: relayed once more, with no hop left after that.
    dec = Router(relay, RelayPolicy(relay_unicast=True)).on_forward(
        wrap_forward(unicast, 8, [origin, *between[1:], other]), other, peers, now
    )
    assert [(len(parse_forward(s.data).path), parse_forward(s.data).hop_limit) for s in dec.sends] == [
        (MAX_PATH, 1)
    ]


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="measures RSS through /proc")
def test_pushed_dictionaries_are_cached_within_a_bound() -> None:
    base = dict_target.vector_dictionary().content
    before = _rss()
    for i in range(300):
        dict_id = 70000 + i
        content = base[:4] + dict_id.to_bytes(4, "little") + base[8:]
        body = Dict(dict_id=dict_id, sha256=hashlib.sha256(content).digest(), content=content)
        DictState(dict_target.config()).on_dict(body.SerializeToString())
    # 300 dictionaries of 4 KiB keep about 40 MiB when all are cached; a bounded cache keeps a few.
    assert _rss() - before < 16 * MiB


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="measures RSS through /proc")
def test_derived_dictionaries_are_cached_within_a_bound() -> None:
    local = dict_target.local().agent_id
    dict_ids = [dict_target.vector_dictionary().dict_id]
    before = _rss()
    for i in range(300):
        peer = Identity.from_seed(i.to_bytes(32, "little")).agent_id
        assert DictState(dict_target.config()).push_frame(local, Hello(agent_id=peer, dict_ids=dict_ids))
    assert _rss() - before < 16 * MiB
