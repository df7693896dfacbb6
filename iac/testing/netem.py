"""A link emulator between two network namespaces joined through TUN devices.

    sudo .venv/bin/python -m iac.testing.netem check          # can this machine build the link?
    sudo .venv/bin/python -m iac.testing.netem demo --loss 0.03 --delay 0.01 [--rate 10]

A userspace relay can drop UDP datagrams but not TCP segments (the kernel's TCP would retransmit
over the relay's own connection), so a :class:`Link` joins namespace ``iacb<pid>a`` (10.200.0.1
on a TUN device) to ``iacb<pid>b`` (10.200.0.2) through a forwarder process (``netem forward``)
that holds both TUN devices and passes every IP packet, whatever the protocol, through an
:class:`Impairer` per direction: seeded loss, delay (one way), jitter, reordering, duplication,
and an ``mtu`` above which packets are dropped (settable mid-run).

An optional :class:`Bottleneck` per direction comes first: a rate limit with a bounded drop-tail
queue (:class:`Shaper`), in the forwarder and not a kernel qdisc, because a qdisc on the sending
host's own device pushes back on TCP (TCP small queues) so TCP would never overflow it as it does
at a real bottleneck. :meth:`Bottleneck.for_path` sizes the queue in bandwidth-delay products.
:class:`CpuMeter` (re-exported) marks runs in which a process was above :data:`CPU_LIMIT_PERCENT`;
the forwarder runs at ``nice`` -10 so busy endpoints do not starve it into a hidden queue.

Needs Linux, root, iproute2 and ``/dev/net/tun`` (:func:`unavailable` says which is missing).
:meth:`Link.close` (also at exit) ends the forwarder and every :meth:`Link.popen` process and
deletes both namespaces. The forwarder answers one JSON line per command on its stdin: ``{"cmd":
"set", "impairment": {...}, "bottleneck": {...} | null}``, ``{"cmd": "stats"}``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import fcntl
import heapq
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

# Re-exported: the link's parts are used as netem.X by the scenarios and tests.
from iac.testing.cpumeter import CPU_LIMIT_PERCENT as CPU_LIMIT_PERCENT
from iac.testing.cpumeter import CpuMeter as CpuMeter
from iac.testing.cpumeter import cpu_limited as cpu_limited
from iac.testing.impair import MIN_QUEUE_BYTES as MIN_QUEUE_BYTES
from iac.testing.impair import Bottleneck as Bottleneck
from iac.testing.impair import Impairer as Impairer
from iac.testing.impair import Shaper as Shaper
from iac.testing.nat import LabError as LabError
from iac.testing.nat import enter_netns, run
from iac.testing.relay import Impairment

ADDR_A = "10.200.0.1"
ADDR_B = "10.200.0.2"
PREFIX = 24
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_QUEUE = 8192  # packets held by the forwarder (both directions); beyond it a packet is dropped
MAX_PACKET = 65535
MAX_LIFETIME = 6 * 3600.0  # the forwarder stops by itself after this many seconds
#: Bottleneck queues, in bandwidth-delay products of the path.
SHALLOW_BDP = 0.5
DEEP_BDP = 8.0
FORWARDER_NICE = -10


# --- the forwarder process ----------------------------------------------------------------------


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def forward(
    ns_a: str,
    tun_a: str,
    ns_b: str,
    tun_b: str,
    seed: int,
    imp: Impairment,
    bottleneck: Bottleneck | None = None,
) -> int:
    """Run the forwarder until stdin closes (or MAX_LIFETIME passes)."""
    enter_netns(f"/var/run/netns/{ns_a}")
    fd_a = _open_tun(tun_a)
    enter_netns(f"/var/run/netns/{ns_b}")
    fd_b = _open_tun(tun_b)
    dirs = {fd_a: (Impairer(imp, seed), fd_b), fd_b: (Impairer(imp, seed + 1), fd_a)}
    names = {fd_a: "a_to_b", fd_b: "b_to_a"}
    shapers: dict[int, Shaper] = {}
    _set_bottleneck(shapers, dirs, bottleneck)
    queue: list[tuple[float, int, int, bytes, int]] = []  # (due, seq, out fd, packet, from fd)
    seq = 0
    stdin = sys.stdin.fileno()
    poller = select.poll()
    for fd in (fd_a, fd_b, stdin):
        poller.register(fd, select.POLLIN)
    print(json.dumps({"ready": True}), flush=True)
    started = time.monotonic()
    buf = b""
    while time.monotonic() - started < MAX_LIFETIME:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, dest, packet, src = heapq.heappop(queue)
            st = dirs[src][0].stats
            try:
                os.write(dest, packet)
                st.delivered += 1
                st.delivered_bytes += len(packet)
            except OSError:
                st.dropped_queue += 1
        timeout_ms = -1 if not queue else max(0, int((queue[0][0] - time.monotonic()) * 1000) + 1)
        for fd, _ev in poller.poll(timeout_ms):
            if fd == stdin:
                chunk = os.read(stdin, 65536)
                if not chunk:
                    return 0
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        print(json.dumps(_command(json.loads(line), dirs, names, shapers)), flush=True)
                continue
            impairer, dest = dirs[fd]
            shaper = shapers.get(fd)
            for _ in range(256):  # at most this many packets per wake-up
                try:
                    packet = os.read(fd, MAX_PACKET)
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                        break
                    raise
                now = time.monotonic()
                mtu = impairer.impairment.mtu
                if mtu is not None and len(packet) > mtu:  # dropped before it takes queue space
                    impairer.schedule(now, len(packet))  # counted as dropped_mtu
                    continue
                if shaper is not None:  # the bottleneck's queue, then the impairment
                    leaves = shaper.admit(now, len(packet))
                    if leaves is None:
                        impairer.stats.packets += 1
                        impairer.stats.bytes += len(packet)
                        continue
                    now = leaves
                for due in impairer.schedule(now, len(packet)):
                    if len(queue) >= MAX_QUEUE:
                        impairer.stats.dropped_queue += 1
                        continue
                    seq += 1
                    heapq.heappush(queue, (due, seq, dest, packet, fd))
    return 0


def _set_bottleneck(
    shapers: dict[int, Shaper], dirs: dict[int, tuple[Impairer, int]], bottleneck: Bottleneck | None
) -> None:
    shapers.clear()
    if bottleneck is not None:
        for fd, (impairer, _) in dirs.items():
            shapers[fd] = Shaper(bottleneck, impairer.stats)


def _bottleneck(fields: dict[str, Any] | None) -> Bottleneck | None:
    return None if fields is None else Bottleneck(**fields)


def _command(
    cmd: dict[str, Any],
    dirs: dict[int, tuple[Impairer, int]],
    names: dict[int, str],
    shapers: dict[int, Shaper],
) -> Any:
    if cmd.get("cmd") == "set":
        if "impairment" in cmd:
            imp = Impairment(**cmd["impairment"])
            for impairer, _ in dirs.values():
                impairer.impairment = imp
        if "bottleneck" in cmd:
            _set_bottleneck(shapers, dirs, _bottleneck(cmd["bottleneck"]))
        return {"ok": True}
    if cmd.get("cmd") == "stats":
        return {names[fd]: asdict(impairer.stats) for fd, (impairer, _) in dirs.items()}
    return {"error": f"unknown command {cmd!r}"}


# --- the link -----------------------------------------------------------------------------------


def unavailable() -> str | None:
    """Why this machine cannot build a link, or None when it can (probably: :meth:`Link.start`
    is the real test)."""
    if not sys.platform.startswith("linux"):
        return f"Linux network namespaces not available (this is {sys.platform}) — run it on Linux"
    if os.geteuid() != 0:
        return "root needed for ip netns and TUN devices — run it as root (sudo iac bench)"
    if shutil.which("ip") is None:
        return "ip not found — apt-get install iproute2"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun not available — modprobe tun (or give the container the TUN device)"
    return None


def _ip(*args: str) -> None:
    run("ip", *args)  # raises LabError naming the command


_LIVE: list[Link] = []


def _close_all() -> None:
    for link in list(_LIVE):
        link.close()


atexit.register(_close_all)


class Link:
    """Two namespaces joined through an impaired TUN pair; a context manager."""

    def __init__(
        self,
        impairment: Impairment | None = None,
        seed: int = 1,
        tag: str | None = None,
        bottleneck: Bottleneck | None = None,
    ) -> None:
        tag = tag or str(os.getpid())
        self.ns_a, self.ns_b = f"iacb{tag}a", f"iacb{tag}b"
        self.tun_a, self.tun_b = self.ns_a, self.ns_b
        if len(self.tun_a) > 15:
            raise LabError("tag too long for an interface name")
        self.seed = seed
        self.impairment = impairment or Impairment()
        self.bottleneck = bottleneck
        self.forwarder: subprocess.Popen[str] | None = None
        self.procs: list[subprocess.Popen[Any]] = []
        self._made: list[str] = []

    def __enter__(self) -> Link:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        reason = unavailable()
        if reason:
            raise LabError(reason)
        _LIVE.append(self)
        try:
            for ns, tun, addr in ((self.ns_a, self.tun_a, ADDR_A), (self.ns_b, self.tun_b, ADDR_B)):
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "tuntap", "add", "dev", tun, "mode", "tun")
                _ip("-n", ns, "addr", "add", f"{addr}/{PREFIX}", "dev", tun)
                _ip("-n", ns, "link", "set", tun, "up")
            imp, b = asdict(self.impairment), None if self.bottleneck is None else asdict(self.bottleneck)
            argv = [sys.executable, "-m", "iac.testing.netem", "forward", self.ns_a, self.tun_a, self.ns_b]
            argv += [self.tun_b, "--seed", str(self.seed), "--impairment", json.dumps(imp)]
            argv += ["--bottleneck", json.dumps(b)]
            self.forwarder = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
            )
            line = self._read_line(10.0)
            if not json.loads(line).get("ready"):
                raise LabError(f"forwarder did not start: {line!r}")
        except BaseException:
            self.close()
            raise

    def _read_line(self, timeout: float) -> str:
        fw = self.forwarder
        if fw is None or fw.stdout is None:
            raise LabError("no forwarder")
        ready, _, _ = select.select([fw.stdout], [], [], timeout)
        if not ready:
            raise LabError("forwarder did not answer in time")
        line = fw.stdout.readline()
        if not line:
            raise LabError(f"forwarder exited (code {fw.poll()})")
        return line

    def _ask(self, cmd: dict[str, Any]) -> Any:
        fw = self.forwarder
        if fw is None or fw.stdin is None:
            raise LabError("no forwarder")
        fw.stdin.write(json.dumps(cmd) + "\n")
        fw.stdin.flush()
        return json.loads(self._read_line(10.0))

    def set_impairment(self, impairment: Impairment) -> None:
        self.impairment = impairment
        self._ask({"cmd": "set", "impairment": asdict(impairment)})

    def set_path(self, impairment: Impairment, bottleneck: Bottleneck | None) -> None:
        """Impairment and bottleneck (None: no rate limit) at once, for packets read from now on."""
        self.impairment, self.bottleneck = impairment, bottleneck
        b = None if bottleneck is None else asdict(bottleneck)
        self._ask({"cmd": "set", "impairment": asdict(impairment), "bottleneck": b})

    @property
    def forwarder_pid(self) -> int | None:
        return None if self.forwarder is None else self.forwarder.pid

    def stats(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = self._ask({"cmd": "stats"})
        return out

    def command(self, side: str, argv: list[str]) -> list[str]:
        """``argv`` run inside namespace ``side`` ("a" or "b")."""
        return ["ip", "netns", "exec", self.ns_a if side == "a" else self.ns_b, *argv]

    def popen(self, side: str, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside namespace ``side``; :meth:`close` ends it."""
        proc: subprocess.Popen[Any] = subprocess.Popen(self.command(side, argv), **kw)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in [*self.procs, *([self.forwarder] if self.forwarder else [])]:
            _stop(proc)
        self.procs.clear()
        self.forwarder = None
        for ns in reversed(self._made):
            with contextlib.suppress(LabError, OSError, subprocess.SubprocessError):
                _ip("netns", "del", ns)
        self._made.clear()
        if self in _LIVE:
            _LIVE.remove(self)


def _stop(proc: subprocess.Popen[Any], grace: float = 3.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(OSError, ValueError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace)


#: The demo's TCP echo: ``serve`` in namespace b, ``N`` (round trips) in namespace a.
_ECHO = f"""
import socket, statistics, sys, time
if sys.argv[1] == "serve":
    s = socket.create_server(("{ADDR_B}", 9000))
    print("listening", flush=True)
    c, _ = s.accept()
    while d := c.recv(65536):
        c.sendall(d)
    sys.exit()
c = socket.create_connection(("{ADDR_B}", 9000), timeout=30)
rtts = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    c.sendall(b"x" * 100)
    n = 0
    while n < 100:
        n += len(c.recv(100 - n))
    rtts.append((time.perf_counter() - t) * 1e3)
print(f"TCP echo A->B over the link: {{len(rtts)}} round trips, ms min {{min(rtts):.1f}} "
      f"median {{statistics.median(rtts):.1f}} max {{max(rtts):.1f}}")
"""


# --- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("forward", help="(internal) the forwarder process")
    for name in ("ns_a", "tun_a", "ns_b", "tun_b"):
        f.add_argument(name)
    f.add_argument("--seed", type=int, default=1)
    f.add_argument("--impairment", default="{}")
    f.add_argument("--bottleneck", default="null")
    sub.add_parser("check", help="say whether this machine can build the link")
    d = sub.add_parser("demo", help="build a link, ping across it, tear it down")
    d.add_argument("--loss", type=float, default=0.0)
    d.add_argument("--delay", type=float, default=0.010, help="seconds, one way")
    d.add_argument("--count", type=int, default=20)
    d.add_argument("--rate", type=float, default=None, help="bottleneck, Mbit/s (default: none)")
    d.add_argument("--buffer-bdp", type=float, default=SHALLOW_BDP, help="its queue, in BDPs")
    args = ap.parse_args(argv)
    if args.cmd == "forward":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(OSError):  # not starved by busy endpoints (needs root)
            os.nice(FORWARDER_NICE)
        imp, bottleneck = Impairment(**json.loads(args.impairment)), _bottleneck(json.loads(args.bottleneck))
        return forward(args.ns_a, args.tun_a, args.ns_b, args.tun_b, args.seed, imp, bottleneck)
    if args.cmd == "check":
        reason = unavailable()
        if reason is None:
            try:
                with Link(tag=f"c{os.getpid()}"):
                    pass
            except LabError as exc:
                reason = str(exc)
        print("available" if reason is None else f"unavailable: {reason}")
        return 0 if reason is None else 1
    rtt = 2 * args.delay
    bottleneck = None if args.rate is None else Bottleneck.for_path(args.rate, rtt, args.buffer_bdp)
    with Link(Impairment(delay=args.delay, loss=args.loss), bottleneck=bottleneck) as link:
        server = link.popen("b", [sys.executable, "-c", _ECHO, "serve"], stdout=subprocess.PIPE, text=True)
        if server.stdout is not None:
            server.stdout.readline()  # "listening"
        res = subprocess.run(
            link.command("a", [sys.executable, "-c", _ECHO, str(args.count)]),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        print(res.stdout.strip() or res.stderr.strip())
        print(json.dumps(link.stats()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
