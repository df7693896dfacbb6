"""The committed results files, the figures taken from them, the targets they are held to, and
the registry of what each marked section shows (:data:`RENDERERS`).

A figure is put on a :class:`Sheet` under a key inside its file's *family* (the file name without
its date), formatted by the one function its kind names, so two sections that show the same
figure show the same text unless they read different runs.
"""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iac.bench.harness.paths import PACKAGE, RESULTS, ROOT

DATED = re.compile(r"^(\d{4}-\d{2}-\d{2})-(.+)\.json$")
RECORD_SCHEMA = "iac-bench-record/1"  # iac/bench/harness/record.py's wrapper around a script's JSON

#: Targets no benchmark script holds as a constant (transport.py's ``TARGET_*`` are read from it,
#: node.py writes its targets into its JSON).
CODEC_RATIO_TARGET = 0.80  # codec.py's verdict: (t_sign + t_verify) / (t_encode + t_decode)
DICT_SAVING_TARGET = 0.60  # tests/test_dicts.py: the shipped dictionary saves >= 60 % on test.jsonl
FILE_QUIC_TARGET = 0.7  # IAC-QUIC send_file MB/s >= 0.7 x a bare aioquic stream


# --- results files ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Results:
    """One committed results file: the suite's ``results.json``, or a script's JSON wrapped by
    ``iac/bench/harness/record.py``; both carry ``command``, ``started`` and ``environment``."""

    path: str  # relative to the repository root
    doc: dict[str, Any]

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def family(self) -> str:
        """The file name without its date: the command that produced it."""
        m = DATED.match(self.name)
        return m.group(2) if m else Path(self.path).stem

    @property
    def data(self) -> dict[str, Any]:
        """The command's own JSON (a script's, unwrapped; the suite's is the file itself)."""
        inner = self.doc["result"] if self.doc.get("schema") == RECORD_SCHEMA else self.doc
        assert isinstance(inner, dict)
        return inner

    def scenario(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.data.get("scenarios", []) if s["name"] == name), None)

    def raw(self, name: str) -> dict[str, Any] | None:
        """A suite scenario's own output, when it ran."""
        sc = self.scenario(name)
        return sc["raw"] if sc is not None and sc["status"] == "ok" else None

    def source_line(self, document: Path) -> str:
        """Where the figures that follow come from, linked relative to ``document``."""
        env = self.doc["environment"]
        libs = env.get("libraries", {})
        versions = ", ".join(
            f"{label} {libs[key]}"
            for label, key in (("aioquic", "aioquic"), ("PyNaCl", "pynacl"), ("zstandard", "zstandard"))
            if libs.get(key)
        )
        commit = env.get("git_commit") or "unknown"
        if env.get("git_dirty"):
            commit += " with uncommitted changes"
        link = os.path.relpath(ROOT / self.path, document.parent)
        started = self.doc["started"].replace("T", " ").replace("+00:00", " UTC")
        return (
            f"*Source: [`{self.path}`]({link}), written by `{self.doc['command']}` started {started} "
            f"at commit {commit}; {env['cpu_model']}, {env['cores']} cores, Python {env['python']}, "
            f"{versions}.*"
        )


def load(path: str) -> Results:
    return Results(path, json.loads((ROOT / path).read_text(encoding="utf-8")))


def latest(family: str) -> str | None:
    """The newest results file of ``family``, relative to the repository root."""
    found = sorted(
        p.name for p in RESULTS.glob("*.json") if (m := DATED.match(p.name)) and m.group(2) == family
    )
    return str((RESULTS / found[-1]).relative_to(ROOT)) if found else None


# --- figures ------------------------------------------------------------------------------------


def fmt_num(x: float) -> str:
    """Three significant digits or so, thousands separated (as the suite's report)."""
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


FORMATS: dict[str, Callable[[float], str]] = {
    "num": fmt_num,
    "ratio": lambda x: f"{x:.2f}",
    "pct": lambda x: f"{x * 100:.1f} %",
    "millions": lambda x: f"{x / 1e6:.3f} M",
    "bytes": lambda x: f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.1f}",
}


def kind_of(unit: str) -> str:
    """The format of a suite row's figures: bytes keep a decimal below 1,000."""
    return "bytes" if unit == "B" else "num"


@dataclass
class Sheet:
    """The figures one section shows: ``family/key`` -> the text shown, and any key it was asked
    to show two ways."""

    values: dict[str, str] = field(default_factory=dict)
    clashes: list[str] = field(default_factory=list)

    def put(self, res: Results, key: str, x: float | None, kind: str = "num") -> str:
        text = "—" if x is None else FORMATS[kind](x)
        full = f"{res.family}/{key}"
        if self.values.setdefault(full, text) != text:
            self.clashes.append(f"{full}: {self.values[full]} and {text}")
        return text

    def span(self, res: Results, key: str, s: dict[str, Any], kind: str = "num") -> str:
        """``median [min .. max]`` of a summary."""
        med = self.put(res, f"{key}/median", s["median"], kind)
        lo, hi = self.put(res, f"{key}/min", s["min"], kind), self.put(res, f"{key}/max", s["max"], kind)
        return f"{med} [{lo} .. {hi}]"


def table(head: Sequence[str], align: str, rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table; ``align`` has one character per column, ``l`` or ``r``."""
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def verdict(met: bool | None) -> str:
    return "not measured" if met is None else ("met" if met else "**missed**")


def row_key(scenario: str, row: dict[str, Any]) -> str:
    """The key of a suite row's figures: ``scenario/contender/metric``."""
    return f"{scenario}/{row['contender']}/{row['metric']}"


def not_ok(res: Results, name: str) -> str | None:
    """Why suite scenario ``name`` has no figures in ``res``, or None when it has."""
    sc = res.scenario(name)
    if sc is None:
        return f"`{name}` is not in this run."
    if sc["status"] == "ok":
        return None
    lines = [line.strip() for line in (sc["reason"] or "").strip().splitlines() if line.strip()]
    why = re.sub(r"(failed \(\d+\)):.*", r"\1", lines[0]) if lines else "no reason given"
    if len(lines) > 1:
        why += f", ending in {lines[-1]}"
    return f"`{name}`: **{sc['status']}** in this run ({why.replace('|', '/')})."


# --- targets ------------------------------------------------------------------------------------


def transport_targets() -> dict[str, float]:
    """The ``TARGET_*`` constants of ``iac/bench/scenarios/transport.py``, read from its source (importing
    it would load the whole transport stack)."""
    tree = ast.parse((PACKAGE / "scenarios" / "transport.py").read_text(encoding="utf-8"))
    out: dict[str, float] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        name = node.targets[0]
        if isinstance(name, ast.Name) and name.id.startswith("TARGET_"):
            out[name.id] = float(ast.literal_eval(node.value))
    return out


@dataclass(frozen=True)
class Target:
    """A target ratio, what one run measured (None: not measured), and the key it is shown under."""

    area: str  # the suite scenario, or "node"
    what: str
    op: str  # ">=", "<=", or "" for a ratio shown without a target
    limit: float | None
    value: float | None
    res: Results
    key: str
    kind: str = "ratio"

    @property
    def met(self) -> bool | None:
        if self.value is None or self.limit is None:
            return None
        return self.value >= self.limit if self.op == ">=" else self.value <= self.limit

    def limit_text(self) -> str:
        if self.limit is None:
            return "—"
        shown = f"{self.limit * 100:.0f} %" if self.kind == "pct" else f"{self.limit:g}"
        return f"{self.op.replace('>=', '≥').replace('<=', '≤')} {shown}"

    def shown(self, sheet: Sheet) -> str:
        return sheet.put(self.res, self.key, self.value, self.kind)


def suite_targets(r: Results) -> list[Target]:
    """The targets measured by the suite's scenarios."""
    tt = transport_targets()
    codec, sizes, rtt, setup, oneway = (r.raw(n) for n in ("codec", "bytes", "rtt", "setup", "oneway"))
    files = r.scenario("filetransfer")
    quic_file = None
    if files is not None and files["status"] == "ok":
        quic_file = next((x for x in files["rows"] if x["contender"] == "IAC-QUIC send_file"), None)
    file_row = quic_file or {"contender": "IAC-QUIC send_file", "metric": "?"}
    file_key = row_key("filetransfer", file_row)
    Figure = tuple[dict[str, Any] | None, Callable[[dict[str, Any]], Any]]  # source, figure
    rows: tuple[tuple[str, str, str, float, Figure, str, str], ...] = (  # area, what, op, limit, …
        ("codec", "codec rate / bare Ed25519 sign + verify (median of per-repetition ratios)", ">=",
         CODEC_RATIO_TARGET, (codec, lambda d: d["speed"]["ratio"]), "codec/ratio/median", "ratio"),
        ("bytes", "payload bytes saved by the shipped dictionary", ">=", DICT_SAVING_TARGET,
         (sizes, lambda d: d["payload_saving_dict"]), "bytes/saving_dict", "pct"),
        ("rtt", "IAC-QUIC p50 RTT / bare aioquic echo (median of per-round ratios)", "<=",
         tt["TARGET_RTT"], (rtt, lambda d: d["ratio_quic"]["median"]), "rtt/ratio_quic/median",
         "ratio"),
        ("oneway",
         "one-way IAC-QUIC messages/s / receiver decode rate (median of per-round ratios)", ">=",
         tt["TARGET_ONEWAY"], (oneway, lambda d: d["ratio"]["median"]), "oneway/ratio/median",
         "ratio"),
        ("setup", "20 ms RTT: QUIC 0-RTT / QUIC 1-RTT first delivery", "<=", tt["TARGET_0RTT"],
         (setup, lambda d: d.get("ratio_0rtt_1rtt")), "setup/ratio_0rtt_1rtt", "ratio"),
        ("setup", "20 ms RTT: QUIC 1-RTT / TLS/TCP first delivery", "<=", tt["TARGET_QUIC_TLS"],
         (setup, lambda d: d.get("ratio_quic_tls")), "setup/ratio_quic_tls", "ratio"),
        ("filetransfer", "IAC-QUIC send_file MB/s / bare aioquic stream", ">=", FILE_QUIC_TARGET,
         (quic_file, lambda d: d["ratio"]), file_key + "/ratio", "ratio"),
    )  # fmt: skip
    return [
        Target(area, what, op, limit, get(src) if src else None, r, key, kind)
        for area, what, op, limit, (src, get), key, kind in rows
    ]


NODE_METRICS = {
    "requests_per_s_at_64": "requests/s at 64 in flight",
    "rtt_p50_us": "p50 RTT",
    "bytes_per_request": "bytes per request",
    "cpu_us_per_request_at_64": "CPU per request, both sides",
}


def node_targets(r: Results, with_info: bool = False) -> list[Target]:
    """``iac/bench/scenarios/node.py``'s targets (and, ``with_info``, its ratios that have none)."""
    out = []
    for t in r.data["targets"]:
        if t["target"] is None and not with_info:
            continue
        op, limit = t["target"].split() if t["target"] else ("", None)
        what = f"{t['contender']} {NODE_METRICS.get(t['metric'], t['metric'])} / {t['baseline']}"
        key = f"targets/{t['contender']}/{t['metric']}/{t['baseline']}"
        out.append(Target("node", what, op, None if limit is None else float(limit), t["ratio"], r, key))
    return out


def targets(res: Sequence[Results], areas: Sequence[str] | None = None) -> list[Target]:
    """Every target of the suite and node.py files among ``res`` (of ``areas`` only, if given)."""
    out: list[Target] = []
    for r in res:
        if r.family == "iac-bench":
            out += suite_targets(r)
        elif r.family == "benchmarks-node":
            out += node_targets(r)
    return [t for t in out if areas is None or t.area in areas]


def target_table(sheet: Sheet, found: Sequence[Target]) -> list[str]:
    rows = [[t.what, t.limit_text(), t.shown(sheet), verdict(t.met), f"`{t.res.name}`"] for t in found]
    return table(["IAC / baseline", "target", "measured", "verdict", "from"], "llrll", rows)


# --- the suite's headline -----------------------------------------------------------------------

#: The headline table's metrics per scenario (``None``: the metric of the largest N).
HEADLINE: dict[str, tuple[str, ...] | None] = {
    "codec": ("send: encode vs sign (µs/msg)", "receive: decode vs verify (µs/msg)"),
    "bytes": ("bytes per message (test.jsonl)",),
    "rtt": ("RTT p50, 1 in flight",),
    "requests": ("RTT p50, 1 in flight", "requests/s, 64 in flight", "server CPU per request, 64 in flight"),
    "setup": ("first delivery, 20 ms RTT",),
    "oneway": ("messages/s",),
    "loss": ("p99 at 0% loss", "p99 at 3% loss"),
    "broadcast": None,
    "filetransfer": None,
    "a2a": ("SendMessage p50, 1 in flight", "SendMessage calls/s, 64 in flight"),
    "reconnect": ("first delivery after a reconnect, 20 ms RTT (Node API)",),
}


def headline(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per IAC figure worth a headline: its baseline, its ratio, whether IAC is ahead,
    and the best other (non-IAC) contender for the same metric."""
    out: list[dict[str, Any]] = []
    for sc in doc["scenarios"]:
        if sc["status"] != "ok" or sc["name"] not in HEADLINE:
            continue
        wanted = HEADLINE[sc["name"]]
        rows = sc["rows"]
        if wanted is None:  # the first metric of the last (largest) size
            timed = [r["metric"] for r in rows if r["unit"] != "B"]
            wanted = (timed[-1],) if timed else ()
        for r in rows:
            if not r["iac"] or r["metric"] not in wanted or r["ratio"] is None:
                continue
            higher = r["better"] == "higher"
            others = [o for o in rows if o["metric"] == r["metric"] and not o["iac"]]
            best = max(others, key=lambda o: o["median"] * (1 if higher else -1), default=None)
            base = next(
                (o for o in rows if o["contender"] == r["baseline"] and o["metric"] == r["metric"]), None
            )
            out.append(
                {
                    "scenario": sc["name"],
                    "metric": r["metric"],
                    "unit": r["unit"],
                    "contender": r["contender"],
                    "median": r["median"],
                    "baseline": r["baseline"],
                    "baseline_median": base["median"] if base else None,
                    "ratio": r["ratio"],
                    "ahead": r["ratio"] > 1 if higher else r["ratio"] < 1,
                    "best_other": best["contender"] if best else None,
                    "best_other_median": best["median"] if best else None,
                }
            )
    return out


# --- sections -----------------------------------------------------------------------------------

#: What a marked section shows: ``RENDERERS[name](sheet, document, results files) -> lines``.
Renderer = Callable[[Sheet, Path, list[Results]], list[str]]
RENDERERS: dict[str, Renderer] = {}
Body = Callable[..., list[str]]


def renderer(name: str) -> Callable[[Renderer], Renderer]:
    """Register ``fn`` as the renderer of the sections named ``name``, as it is."""

    def register(fn: Renderer) -> Renderer:
        RENDERERS[name] = fn
        return fn

    return register


def section(name: str, scenario: str | None = None, **kw: Any) -> Callable[[Body], Body]:
    """Register ``body(sheet, r, **kw)`` for the sections named ``name``, each of one results file
    ``r``: its lines follow the file's source line, or only why, when suite scenario ``scenario``
    has no figures in ``r``."""

    def register(body: Body) -> Body:
        def render(sheet: Sheet, doc: Path, res: list[Results]) -> list[str]:
            (r,) = res
            out = [r.source_line(doc), ""]
            if scenario is not None and (why := not_ok(r, scenario)):
                return [*out, why]
            return out + body(sheet, r, **kw)

        RENDERERS[name] = render
        return body

    return register
