"""NATs built from Linux network namespaces, for tests and benchmarks: :class:`NatLab`.

Topology (one lab; the names carry a tag so that labs of several processes do not meet)::

    host a (10.77.1.2) -- nat a -- |                      | -- nat b -- host b (10.77.2.2)
                      (10.77.1.1)  |  public 198.51.100.1 |  (10.77.2.1)
                    WAN 198.51.100.2                    WAN 198.51.100.6 (or 198.51.100.2
                                                                          when b shares nat a)

* ``public`` routes between the NATs' WAN sides and hosts what every host can reach (a
  registry, a relay) at :data:`PUBLIC_ADDR`.
* Each NAT masquerades its LAN behind its WAN address (``iptables -t nat ... MASQUERADE``;
  ``random_fully``: a symmetric NAT, a new random port per destination) and drops unsolicited
  inbound packets on its WAN side (``-m conntrack --ctstate NEW -j DROP``), as real NATs do.
* ``shared``: both hosts sit behind NAT a (hairpin: a host reaching the other through the
  NAT's WAN address needs the NAT to loop the packet back, which MASQUERADE alone does not).

Code runs inside a namespace with :func:`in_namespace` (the calling thread enters it; a
socket keeps the namespace it was made in, so a node started inside stays there). Needs root,
``ip``, ``iptables`` and ``conntrack`` (:func:`unavailable` says what is missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

CLONE_NEWNET = 0x40000000

#: Where the public namespace is reached from behind either NAT.
PUBLIC_ADDR = "198.51.100.1"
#: The same over IPv6 (``NatLab(ipv6=True)``: NAT66 with ``ip6tables ... MASQUERADE``).
PUBLIC_ADDR6 = "2001:db8:100:1::1"
HOST_A = "10.77.1.2"
HOST_B = "10.77.2.2"


def unavailable() -> str | None:
    """Why a lab cannot be built here, or None."""
    if not sys.platform.startswith("linux"):
        return f"needs Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "needs root (ip netns, iptables); run the suite as root to include it"
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables"), ("ip6tables", "iptables"),
                          ("conntrack", "conntrack")):  # fmt: skip
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install {package}; tools/test-deps.sh installs it)"
    return None


class LabError(RuntimeError):
    """A step of building the lab or a link failed (the message names it)."""


def run(*argv: str, ns: str | None = None, check: bool = True) -> str:
    """Run a command (inside namespace ``ns`` when given); return its output."""
    full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    res = subprocess.run(full, capture_output=True, text=True, timeout=20, check=False)
    if check and res.returncode != 0:
        raise LabError(f"`{' '.join(full)}` failed: {res.stderr.strip() or res.returncode}")
    return res.stdout


def enter_netns(path: str) -> None:
    """The calling thread joins the network namespace at ``path`` (``/var/run/netns/NAME``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "setns"):  # Python 3.12+
            os.setns(fd, CLONE_NEWNET)
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


@contextlib.contextmanager
def in_namespace(ns: str) -> Iterator[None]:
    """The calling thread is in network namespace ``ns`` inside the block (sockets made there
    stay in it), and back in its own afterwards."""
    own = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    try:
        enter_netns(f"/var/run/netns/{ns}")
        try:
            yield
        finally:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(own, CLONE_NEWNET) != 0:  # pragma: no cover - only if the kernel refuses
                raise OSError(ctypes.get_errno(), "setns back failed")
    finally:
        os.close(own)


@dataclass
class NatLab:
    """Public namespace, two NATs (or one shared), two hosts; a context manager."""

    tag: str = field(default_factory=lambda: str(os.getpid()))
    symmetric: bool = False
    shared: bool = False
    #: IPv6 as well (not with ``shared``): ULA LANs behind NAT66, documentation-prefix WANs.
    ipv6: bool = False
    _made: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        t = self.tag
        self.public, self.nat_a, self.nat_b = f"iacn{t}p", f"iacn{t}na", f"iacn{t}nb"
        self.host_a, self.host_b = f"iacn{t}a", f"iacn{t}b"
        self.wan_a = "198.51.100.2"
        self.wan_b = self.wan_a if self.shared else "198.51.100.6"
        self.addr_a = HOST_A
        self.addr_b = "10.77.1.3" if self.shared else HOST_B
        self.addr6_a, self.addr6_b = "fd77:1::2", "fd77:2::2"
        self.wan6_a, self.wan6_b = "2001:db8:100:1::2", "2001:db8:100:2::2"
        if self.ipv6 and self.shared:
            raise LabError("an IPv6 lab has two NATs (shared is IPv4 only)")

    def __enter__(self) -> NatLab:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ns(self, name: str) -> None:
        run("ip", "netns", "add", name)
        self._made.append(name)
        run("ip", "-n", name, "link", "set", "lo", "up")

    def _site(self, port: str, gateway: str, wan: str, nat: str, lan: str, host: str, host_addr: str) -> None:
        """A NAT on the public network (its ``wan`` address, the public side's ``gateway``) and a
        host behind it on the ``lan`` /24 (the NAT at ``lan``.1), each routing through the other."""
        self._veth(self.public, port, f"{gateway}/30", nat, "wan", f"{wan}/30")
        self._veth(nat, "lan", f"{lan}.1/24", host, "eth0", f"{host_addr}/24")
        run("ip", "-n", host, "route", "add", "default", "via", f"{lan}.1")
        run("ip", "-n", nat, "route", "add", "default", "via", gateway)
        self._nat(nat, f"{lan}.0/24")

    def _veth(self, ns1: str, if1: str, addr1: str, ns2: str, if2: str, addr2: str) -> None:
        run("ip", "link", "add", if1, "netns", ns1, "type", "veth", "peer", if2, "netns", ns2)
        run("ip", "-n", ns1, "addr", "add", addr1, "dev", if1)
        run("ip", "-n", ns2, "addr", "add", addr2, "dev", if2)
        run("ip", "-n", ns1, "link", "set", if1, "up")
        run("ip", "-n", ns2, "link", "set", if2, "up")

    def _nat(self, ns: str, lan_net: str, tables: str = "iptables") -> None:
        run("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", ns=ns)
        masq = [tables, "-t", "nat", "-A", "POSTROUTING", "-s", lan_net, "-o", "wan", "-j", "MASQUERADE"]
        if self.symmetric:
            masq.append("--random-fully")
        run(*masq, ns=ns)
        for chain in ("FORWARD", "INPUT"):  # unsolicited inbound: dropped, routed on or addressed to it
            drop = ["-i", "wan", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"]
            run(tables, "-A", chain, *drop, ns=ns)

    def _addr6(self, ns: str, dev: str, addr: str) -> None:
        run("ip", "-n", ns, "addr", "add", addr, "dev", dev, "nodad")  # usable at once

    def _start6(self) -> None:
        run("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1", ns=self.public)
        run("ip6tables", "-A", "FORWARD", "-p", "udp", ns=self.public)
        run("ip6tables", "-A", "INPUT", "-p", "udp", ns=self.public)
        for side, pub_if, nat, host, lan, addr, wan in (
            (1, "pa", self.nat_a, self.host_a, "fd77:1::", self.addr6_a, self.wan6_a),
            (2, "pb", self.nat_b, self.host_b, "fd77:2::", self.addr6_b, self.wan6_b),
        ):
            gw = f"2001:db8:100:{side}::1"
            self._addr6(self.public, pub_if, f"{gw}/64")
            self._addr6(nat, "wan", f"{wan}/64")
            self._addr6(nat, "lan", f"{lan}1/64")
            self._addr6(host, "eth0", f"{addr}/64")
            run("ip", "-n", host, "-6", "route", "add", "default", "via", f"{lan}1")
            run("ip", "-n", nat, "-6", "route", "add", "default", "via", gw)
            self._nat(nat, f"{lan}/64", "ip6tables")

    def start(self) -> None:
        reason = unavailable()
        if reason:
            raise LabError(reason)
        try:
            for ns in (self.public, self.nat_a, self.host_a, self.host_b):
                self._ns(ns)
            if not self.shared:
                self._ns(self.nat_b)
            run("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=self.public)
            # counters only: UDP packets routed between the NATs, and received in public
            run("iptables", "-A", "FORWARD", "-p", "udp", ns=self.public)
            run("iptables", "-A", "INPUT", "-p", "udp", ns=self.public)
            self._site("pa", "198.51.100.1", "198.51.100.2", self.nat_a, "10.77.1", self.host_a, self.addr_a)
            if self.shared:
                run("ip", "link", "add", "lan2", "netns", self.nat_a, "type", "veth", "peer", "eth0",
                    "netns", self.host_b)  # fmt: skip
                run("ip", "-n", self.host_b, "addr", "add", f"{self.addr_b}/24", "dev", "eth0")
                run("ip", "-n", self.host_b, "link", "set", "eth0", "up")
                run("ip", "-n", self.nat_a, "link", "set", "lan2", "up")
                # both hosts on one LAN: a bridge in the NAT joins its two LAN ports
                run("ip", "-n", self.nat_a, "link", "add", "br0", "type", "bridge")
                run("ip", "-n", self.nat_a, "addr", "del", "10.77.1.1/24", "dev", "lan")
                for port in ("lan", "lan2"):
                    run("ip", "-n", self.nat_a, "link", "set", port, "master", "br0")
                run("ip", "-n", self.nat_a, "addr", "add", "10.77.1.1/24", "dev", "br0")
                run("ip", "-n", self.nat_a, "link", "set", "br0", "up")
                run("ip", "-n", self.host_b, "route", "add", "default", "via", "10.77.1.1")
            else:
                self._site(
                    "pb", "198.51.100.5", "198.51.100.6", self.nat_b, "10.77.2", self.host_b, self.addr_b
                )
            if self.ipv6:
                self._start6()
        except BaseException:
            self.close()
            raise

    def flush_mappings(self, nat: str) -> None:
        """Drop every UDP mapping of NAT namespace ``nat`` (``conntrack -D``), as a NAT that
        forgets its mappings mid-conversation does."""
        run("conntrack", "-D", "-p", "udp", ns=nat, check=False)

    def block_direct(self, blocked: bool = True) -> None:
        """Drop (or stop dropping) every UDP packet routed between the two NATs: the direct path
        between the hosts dies, what goes to and from the public namespace still flows."""
        for tables in ("iptables", "ip6tables") if self.ipv6 else ("iptables",):
            rule = ["FORWARD", "-p", "udp", "-j", "DROP"]
            run(tables, "-I" if blocked else "-D", *rule, ns=self.public)

    def _counter(self, chain: str) -> int:
        out = run("iptables", "-L", chain, "-v", "-x", "-n", ns=self.public)
        return sum(int(line.split()[0]) for line in out.splitlines()[2:] if line.strip())

    def forwarded(self) -> int:
        """UDP packets the public namespace routed from one NAT to the other so far (a direct
        path between the hosts crosses it there)."""
        return self._counter("FORWARD")

    def received_public(self) -> int:
        """UDP packets addressed to the public namespace so far (what its relay received)."""
        return self._counter("INPUT")

    def received_public_bytes(self) -> int:
        """Bytes of those packets (IP headers included)."""
        out = run("iptables", "-L", "INPUT", "-v", "-x", "-n", ns=self.public)
        return sum(int(line.split()[1]) for line in out.splitlines()[2:] if line.strip())

    def close(self) -> None:
        for ns in reversed(self._made):
            run("ip", "netns", "del", ns, check=False)
        self._made.clear()


class NatScene:
    """On a started :class:`NatLab`: a relay that is also a registry in the public namespace
    (over IPv6 with ``ipv6``, on an ``ipv6`` lab),
    node ``a`` and node ``b`` behind their NATs (QUIC, one socket each), each connected to the
    relay with a route to the other through it and a :class:`~iac.mesh.Traversal`; ``b``
    answers RUN with its payload (each payload handled is kept in ``handled``). An async
    context manager; everything is closed at the end."""

    def __init__(
        self, lab: NatLab, config: Any = None, direct_timeout: float = 8.0, ipv6: bool = False
    ) -> None:
        self.lab = lab
        self.ipv6 = ipv6
        self.config = config
        self.direct_timeout = direct_timeout
        self.handled: list[str] = []

    async def __aenter__(self) -> NatScene:
        from iac.mesh.nat import Traversal
        from iac.mesh.service import serve_registry
        from iac.node.config import NodeConfig
        from iac.node.node import Node
        from iac.protocol.routing import RelayPolicy
        from iac.wire.enums import MessageType

        lab = self.lab
        config = self.config or NodeConfig()
        public, host_a, host_b = (
            (f"[{PUBLIC_ADDR6}]", f"[{lab.addr6_a}]", f"[{lab.addr6_b}]")
            if self.ipv6
            else (PUBLIC_ADDR, lab.addr_a, lab.addr_b)
        )
        relaying = NodeConfig(relay_policy=RelayPolicy(relay_unicast=True))
        self.relay = Node(listen=[f"quic://{public}:0"], config=relaying)
        with in_namespace(lab.public):
            await self.relay.start()
        self.registry = serve_registry(self.relay)
        self.a = Node(listen=[f"quic://{host_a}:0"], config=config)
        self.b = Node(listen=[f"quic://{host_b}:0"], config=config)
        with in_namespace(lab.host_a):
            await self.a.start()
        with in_namespace(lab.host_b):
            await self.b.start()
        for node, other in ((self.a, self.b), (self.b, self.a)):
            node.add_peer(self.relay.agent_id, *self.relay.addresses)
            node.add_route(other.agent_id, self.relay.agent_id)
            await node.connect(self.relay.agent_id)

        def handle(ctx: Any) -> Any:
            self.handled.append(str(ctx.payload))
            return ctx.payload

        self.b.on(MessageType.RUN)(handle)
        self.ta = Traversal(self.a, relays=[self.relay.agent_id], direct_timeout=self.direct_timeout)
        self.tb = Traversal(self.b, relays=[self.relay.agent_id], direct_timeout=self.direct_timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ta.close()
        await self.tb.close()
        for node in (self.a, self.b, self.relay):
            await node.close()

    async def observe(self) -> tuple[str, str]:
        """Both nodes ask the relay at which address it sees them (their observed candidates);
        the two addresses, ``a``'s then ``b``'s."""
        return await self.ta.observe(self.relay.agent_id), await self.tb.observe(self.relay.agent_id)

    def relayed(self) -> int:
        """Messages the relay sent on for others so far."""
        return int(self.relay.stats().routing.get("relayed", 0))

    async def requests(self, n: int, tag: str, payload: str = "") -> list[float]:
        """``n`` requests from ``a`` to ``b`` (each answered with its payload); their round trips (s)."""
        from iac.wire.enums import MessageType

        loop = asyncio.get_running_loop()
        rtts: list[float] = []
        for i in range(n):
            body = f"{tag}{i}{payload}"
            t0 = loop.time()
            reply = await self.a.request(self.b.agent_id, MessageType.RUN, body, timeout=10)
            rtts.append(loop.time() - t0)
            if reply.payload != body:
                raise AssertionError(f"wrong answer {str(reply.payload)[:40]!r}")
        return rtts


__all__ = [
    "HOST_A",
    "HOST_B",
    "PUBLIC_ADDR",
    "PUBLIC_ADDR6",
    "LabError",
    "NatLab",
    "NatScene",
    "enter_netns",
    "in_namespace",
    "unavailable",
]
