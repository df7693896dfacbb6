"""``iac demo``: a 5-process agent mesh on loopback (``make demo``).

The driver (:func:`run_demo`) writes five keys (mode 0600) into a temporary directory and starts
five agent processes (``python -m iac.demo.agent ROLE``, see that module for the scenario):

* ``registry``   — the embedded SQLite registry (a file in the temporary directory), TLS;
* ``planner``    — finds the others by capability, calls, delegates step 1/4, broadcasts, TLS;
* ``researcher`` — an exposed function and step 2/4, listening on QUIC;
* ``writer``     — step 3/4 and a file transfer, listening on TLS, relays for the checker;
* ``checker``    — listens only on a UNIX socket beside the writer and publishes no address.

Agents report one JSON line per event on stdout; the driver waits for readiness lines (never for
a fixed time), paces the task steps (a ``go`` line on the next sender's stdin once the previous
sender reported, so byte counts never overlap), prints a table (step, from → to, transport,
latency, bytes on the wire vs the same messages as HTTP+JSON) and exits 0. On any failure it
prints one line and exits 1; its child processes are always stopped (stdin closed, then SIGTERM,
then SIGKILL), and the whole run has a global timeout (:data:`DEMO_TIMEOUT`).

``run_demo(args)`` with ``args.codec`` set runs the earlier codec demo instead
(:func:`iac.demo.codec.run_codec_demo`: a sample of the benchmark corpus signed, compressed and
verified in one process). The HTTP+JSON byte counts come from :mod:`iac.demo.http`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iac.demo.codec import run_codec_demo
from iac.demo.runtime import DemoError
from iac.errors import IacError
from iac.wire.identity import Identity

#: The module each agent process runs (``python -m MODULE ROLE --dir DIR``).
AGENT_MODULE = "iac.demo.agent"
#: The whole demo must finish within this many seconds (it takes a few).
DEMO_TIMEOUT = 45.0
#: How long a child gets to exit after its stdin closed (then SIGTERM, then SIGKILL).
STOP_GRACE = 5.0
ROLES = ("registry", "planner", "researcher", "writer", "checker")
#: The table rows, in the order of the scenario: (key, the agent that reports it).
ROWS = (
    ("lookup", "planner"),
    ("call", "planner"),
    ("step1", "planner"),
    ("step2", "researcher"),
    ("file", "writer"),
    ("step3", "writer"),
    ("step4", "checker"),
    ("relay", "planner"),
    ("broadcast", "planner"),
)
#: Who sends the next step once a row is in (the driver tells it ``go``; see ``Agent.my_turn``).
NEXT_TURN = {"step1": "researcher", "step2": "writer", "step3": "checker", "step4": "planner"}
#: The draft file goes in chunks of this size (several chunks in flight).
FILE_CHUNK_SIZE = 16 * 1024


# --- the driver --------------------------------------------------------------------------------------


@dataclass
class _Child:
    role: str
    proc: asyncio.subprocess.Process
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    readers: list[asyncio.Task[None]] = field(default_factory=list)
    exited: bool = False

    def last_error_line(self) -> str:
        for line in reversed(self.stderr):
            if line.strip():
                return line.strip()[:200]
        return "no output on stderr"


async def _stop(child: _Child) -> None:
    proc = child.proc
    grace = STOP_GRACE
    with contextlib.suppress(OSError, RuntimeError):
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()  # the agent stops when its stdin closes
    if proc.returncode is None:
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 2.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
    for task in child.readers:
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, 1.0)


class _Driver:
    def __init__(self, workdir: Path, module: str = AGENT_MODULE) -> None:
        self.dir = workdir
        self.module = module
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.children: dict[str, _Child] = {}
        self.ids: dict[str, str] = {}  # AgentId -> role
        self.ready: dict[str, dict[str, Any]] = {}
        self.rows: dict[str, dict[str, Any]] = {}
        self.links: dict[tuple[str, str], str] = {}
        self.broadcasts: Counter[str] = Counter()
        self.broadcast_ms: dict[str, float] = {}
        self.byes: dict[str, dict[str, Any]] = {}
        self.verified: dict[str, Any] = {}
        self.received: dict[str, Any] = {}
        self.relayed = 0
        self.done = False
        self.task_id = ""
        self.stopping = False
        self.waiting = "the agents to start"

    # --- processes ---------------------------------------------------------------------------------

    def make_keys(self) -> None:
        for role in ROLES:
            ident = Identity.generate()
            ident.save(self.dir / f"{role}.key")  # mode 0600
            self.ids[ident.agent_id] = role

    async def spawn(self, role: str, registry: str | None) -> None:
        cmd = [sys.executable, "-m", self.module, role, "--dir", str(self.dir)]
        if registry is not None:
            cmd += ["--registry", registry]
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        child = _Child(role, proc)
        self.children[role] = child
        loop = asyncio.get_running_loop()
        child.readers = [
            loop.create_task(self._read_stdout(child)),
            loop.create_task(self._read_stderr(child)),
        ]

    async def _read_stdout(self, child: _Child) -> None:
        assert child.proc.stdout is not None
        while line := await child.proc.stdout.readline():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not an event line
            if isinstance(event, dict):
                await self.queue.put((child.role, event))
        code = await child.proc.wait()
        await self.queue.put((child.role, {"event": "exit", "code": code}))

    async def _read_stderr(self, child: _Child) -> None:
        assert child.proc.stderr is not None
        while line := await child.proc.stderr.readline():
            child.stderr.append(line.decode(errors="replace"))

    async def stop_all(self) -> None:
        """Stop every child (stdin closed, then SIGTERM, then SIGKILL) and wait for all of them."""
        self.stopping = True
        await asyncio.gather(*(_stop(child) for child in self.children.values()))

    # --- events ------------------------------------------------------------------------------------

    def _handle(self, role: str, ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        if kind == "error":
            raise DemoError(f"{role}: {ev.get('message', 'failed')}")
        if kind == "exit":
            self.children[role].exited = True
            code = ev.get("code")
            if not self.stopping or code != 0:
                child = self.children[role]
                raise DemoError(f"{role} exited with code {code} ({child.last_error_line()})")
        elif kind == "ready":
            self.ready[role] = ev
        elif kind == "row":
            key = str(ev.get("key"))
            self.rows[key] = {**ev, "src": role}
            nxt = self.children.get(NEXT_TURN.get(key, ""))
            if nxt is not None and nxt.proc.stdin is not None and not nxt.proc.stdin.is_closing():
                nxt.proc.stdin.write(b"go\n")
        elif kind == "link":
            peer = self.ids.get(str(ev.get("peer")))
            if peer is not None:
                self.links[(role, peer)] = self.links[(peer, role)] = str(ev.get("transport"))
        elif kind == "broadcast":
            self.broadcasts[role] += 1
            self.broadcast_ms[role] = float(ev.get("ms", 0.0))
        elif kind == "verified":
            self.verified = ev
        elif kind == "file":
            self.received = ev
        elif kind == "relayed":
            self.relayed = int(ev.get("count", 0))
        elif kind == "done":
            self.done = True
            self.task_id = str(ev.get("task_id", ""))
        elif kind == "bye":
            self.byes[role] = ev

    async def until(self, waiting: str, done: Callable[[], bool]) -> None:
        """Handle events until ``done()`` is true."""
        self.waiting = waiting
        while not done():
            role, ev = await self.queue.get()
            self._handle(role, ev)

    # --- the run -----------------------------------------------------------------------------------

    async def run(self) -> None:
        self.make_keys()
        await self.spawn("registry", None)
        await self.until("the registry to start", lambda: "registry" in self.ready)
        reg = self.ready["registry"]
        registry = f"{reg['agent_id']}@{reg['addresses'][0]}"
        for role in ("checker", "researcher", "writer"):
            await self.spawn(role, registry)
        await self.until("the agents to publish their records", lambda: len(self.ready) == 4)
        await self.spawn("planner", registry)  # last: the others are in the registry by now
        await self.until("the planner to start", lambda: "planner" in self.ready)
        pids = " ".join(f"{role}={self.ready[role]['pid']}" for role in ROLES)
        print(f"processes: {pids}", flush=True)
        receivers = [r for r in ROLES if r != "planner"]
        await self.until(
            "the scenario to finish",
            lambda: self.done and all(self.broadcasts[r] for r in receivers) and len(self.rows) == len(ROWS),
        )
        self.stopping = True
        for child in self.children.values():
            if child.proc.stdin is not None:
                child.proc.stdin.close()  # each agent stops, reports "bye" and exits 0
        await self.until("the agents to stop", lambda: all(c.exited for c in self.children.values()))
        missing = [r for r in ROLES if r not in self.byes]
        if missing:
            raise DemoError(f"{', '.join(missing)} stopped without reporting")
        twice = [r for r in receivers if self.byes[r].get("broadcasts") != 1]
        if twice:
            raise DemoError(f"the broadcast did not reach {', '.join(twice)} exactly once")
        if not self.verified.get("sha256_ok") or self.received.get("sha256") is None:
            raise DemoError("the checker did not verify the draft's SHA-256")
        if self.relayed < 4:
            raise DemoError(f"the writer relayed {self.relayed} messages, expected at least 4")

    # --- the table ---------------------------------------------------------------------------------

    def _path(self, row: dict[str, Any]) -> tuple[str, str]:
        src, dst, via = row["src"], row["dst"], row.get("via") or ""
        if dst == "*":
            transports = sorted({t for (a, _b), t in self.links.items() if a == src})
            n = len([r for r in ROLES if r != src])
            return f"{src} → all {n}", "+".join(transports)
        if via:
            hops = f"{self.links.get((src, via), '?')}→{self.links.get((via, dst), '?')}"
            return f"{src} → {via} → {dst}", hops
        return f"{src} → {dst}", self.links.get((src, dst), "?")

    def table(self, elapsed: float) -> str:
        out: list[str] = []
        head = f"  {'step':<28} {'from → to':<30} {'transport':<10} {'ms':>7} {'IAC B':>8}"
        head += f" {'HTTP+JSON B':>12} {'IAC/HTTP':>8}"
        out.append(head)
        out.append("  " + "-" * (len(head) - 2))
        tot_iac = tot_http = 0
        for key, _src in ROWS:
            row = self.rows[key]
            path, transport = self._path(row)
            ms = float(row["ms"])
            if key == "broadcast" and self.broadcast_ms:
                ms = max(self.broadcast_ms.values())  # until the last node's handler had it
            iac, http = int(row["iac"]), int(row["http"])
            tot_iac += iac
            tot_http += http
            ratio = f"{iac / http:.0%}" if http else "-"
            out.append(
                f"  {row['step']:<28} {path:<30} {transport:<10} {ms:7.1f} {iac:8d} {http:12d} {ratio:>8}"
            )
        out.append("  " + "-" * (len(head) - 2))
        out.append(
            f"  {'total':<28} {'':<30} {'':<10} {'':>7} {tot_iac:8d} {tot_http:12d} {tot_iac / tot_http:8.0%}"
        )
        tid = self.task_id
        got = ", ".join(f"{r} {self.broadcast_ms[r]:.1f} ms" for r in ROLES if r in self.broadcast_ms)
        rx = self.received
        out += [
            "",
            f"  task {tid}: DELEGATE_TASK 1/4 … 4/4 passed planner → researcher → writer → checker → planner",
            f"    (intents ASSIGN_TASK, PROVIDE_INFO, ASSIGN_TASK, FINAL_RESULT; state_ref iac-demo://{tid}/…)",
            "  lookup: the planner found research, write and check by capability (signed records, verified)",
            f"  file: {rx.get('name')} ({rx.get('size')} B, {self.rows['file']['detail']}) in the checker's"
            f" inbox, SHA-256 {str(rx.get('sha256'))[:16]}… checked",
            "  relay: the checker listens only on a UNIX socket and publishes no address; the writer"
            f" forwarded {self.relayed} frames",
            f"  broadcast: each handler got it once: {got}",
            "  ms: round trip seen by the sender (connections open); broadcast: until the last handler ran",
            "  IAC B: the frames the sender sent and received (its node's stats; the first hop when relayed)",
            "  HTTP+JSON B: the same messages as HTTP/1.1 POST + response, JSON with a SHA-256 hash",
            "    (no TLS, minimal headers: a lower bound for HTTP; the file as base64 in one POST)",
            f"  all 5 processes stopped; {elapsed:.1f} s",
        ]
        return "\n".join(out)


async def run_mesh(workdir: Path, *, module: str = AGENT_MODULE, timeout: float = DEMO_TIMEOUT) -> int:
    """Run the mesh demo with its files in ``workdir``; print the table (0) or one line on stderr (1)."""
    driver = _Driver(workdir, module)
    t0 = time.perf_counter()
    print(f"IAC demo: 5 agent processes on loopback; SQLite registry {workdir / 'registry.db'}", flush=True)
    failure = ""
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    terminated: list[bool] = []

    def on_sigterm() -> None:  # stop the children too, then fail with one line
        terminated.append(True)
        if me is not None:
            me.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        async with asyncio.timeout(timeout):
            await driver.run()
    except TimeoutError:
        failure = f"timed out after {timeout:g} s waiting for {driver.waiting}"
    except (DemoError, OSError, IacError) as exc:
        failure = str(exc)
    except asyncio.CancelledError:
        if not terminated or me is None:
            raise
        me.uncancel()
        failure = f"terminated (SIGTERM) while waiting for {driver.waiting}"
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGTERM)
        await driver.stop_all()  # always: stdin closed, then SIGTERM, then SIGKILL
    if failure:
        print(f"iac demo: failed: {failure}", file=sys.stderr, flush=True)
        return 1
    print()
    print(driver.table(time.perf_counter() - t0))
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """``iac demo``: the mesh on loopback (``args.codec``: the codec demo). 0 on success."""
    if getattr(args, "codec", False):
        return run_codec_demo(args)
    workdir = Path(tempfile.mkdtemp(prefix="iac-demo-"))
    try:
        return asyncio.run(run_mesh(workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


__all__ = [
    "AGENT_MODULE",
    "DEMO_TIMEOUT",
    "FILE_CHUNK_SIZE",
    "NEXT_TURN",
    "ROLES",
    "ROWS",
    "STOP_GRACE",
    "run_demo",
    "run_mesh",
]
