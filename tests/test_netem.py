"""iac.testing.netem: the bottleneck (rate limit and drop-tail queue, pure, fake clock), the
CPU meter, and -- as root on Linux -- UDP and TCP through a bottleneck between two namespaces."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from iac.testing import netem
from iac.testing.relay import Impairment


def test_shaper_releases_at_the_rate_and_drops_when_the_queue_is_full() -> None:
    b = netem.Bottleneck(rate_bps=8e6, queue_bytes=10_000)  # 1 MB/s
    shaper = netem.Shaper(b)
    leaves = [shaper.admit(0.0, 1000) for _ in range(12)]
    # ten packets fit the queue (the first is being sent); the rest are dropped
    assert [x is not None for x in leaves] == [True] * 10 + [False] * 2
    assert leaves[0] == pytest.approx(0.001) and leaves[9] == pytest.approx(0.010)
    assert shaper.stats.dropped_bottleneck == 2
    assert shaper.stats.max_queued_bytes == 10_000
    # once the queue drained, packets go at once again
    assert shaper.admit(0.5, 1000) == pytest.approx(0.501)


def test_shaper_long_run_rate_is_the_bottleneck_rate() -> None:
    b = netem.Bottleneck(rate_bps=10e6, queue_bytes=50_000)
    shaper = netem.Shaper(b)
    now, delivered, last = 0.0, 0, 0.0
    while now < 2.0:  # offered at 20 Mbit/s
        t = shaper.admit(now, 1250)
        if t is not None:
            delivered += 1250
            last = t
        now += 1250 * 8 / 20e6
    assert delivered * 8 / last == pytest.approx(10e6, rel=0.01)
    assert shaper.stats.dropped_bottleneck > 0
    assert shaper.queued <= 50_000


def test_bottleneck_queue_is_a_multiple_of_the_bdp() -> None:
    shallow = netem.Bottleneck.for_path(50, 0.02, netem.SHALLOW_BDP)
    deep = netem.Bottleneck.for_path(50, 0.02, netem.DEEP_BDP)
    bdp = 50e6 / 8 * 0.02
    assert shallow.queue_bytes == int(netem.SHALLOW_BDP * bdp)
    assert deep.queue_bytes == int(netem.DEEP_BDP * bdp)
    assert netem.Bottleneck.for_path(1, 0.001, 0.1).queue_bytes == netem.MIN_QUEUE_BYTES
    with pytest.raises(ValueError):
        netem.Bottleneck(0, 1000)


def test_cpu_meter_measures_this_process() -> None:
    meter = netem.CpuMeter({"me": os.getpid(), "gone": 2**22 + 17}).start()
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    out = meter.stop()
    assert "gone" not in out
    assert 40 <= out["me"] <= 110
    assert meter.machine is None or 0 <= meter.machine <= 100
    assert netem.cpu_limited({"a": 95.0, "b": 10.0}) == ["a"]
    assert netem.cpu_limited({"a": 90.0}) == []


_UDP_SINK = textwrap.dedent(
    f"""
    import socket, time
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    s.bind(("{netem.ADDR_B}", 9001))
    s.settimeout(1.0)
    print("ready", flush=True)
    got, first, last = 0, None, None
    while True:
        try:
            d = s.recv(2048)
        except socket.timeout:
            break
        last = time.monotonic()
        first = first or last
        got += len(d) + 28
    print(got, (last or 0) - (first or 0), flush=True)
    """
)

_UDP_BLAST = textwrap.dedent(
    f"""
    import socket, time
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    end, gap, t = time.monotonic() + 1.5, 1200 * 8 / 20e6, time.monotonic()
    while t < end:
        s.sendto(b"x" * 1172, ("{netem.ADDR_B}", 9001))
        t += gap
        while time.monotonic() < t:
            pass
    """
)

_TCP_SINK = textwrap.dedent(
    f"""
    import socket, time
    srv = socket.create_server(("{netem.ADDR_B}", 9002))
    print("ready", flush=True)
    c, _ = srv.accept()
    got, first = 0, None
    while d := c.recv(1 << 16):
        first = first or time.monotonic()
        got += len(d)
    print(got, time.monotonic() - first, flush=True)
    """
)

_TCP_BULK = textwrap.dedent(
    f"""
    import socket, time
    c = socket.create_connection(("{netem.ADDR_B}", 9002))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic")
    end, buf = time.monotonic() + 2.5, b"y" * 65536
    while time.monotonic() < end:
        c.send(buf)
    c.close()
    """
)


def _through(link: netem.Link, sink: str, sender: str) -> tuple[int, float]:
    proc = link.popen("b", [sys.executable, "-c", sink], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    subprocess.run(link.command("a", [sys.executable, "-c", sender]), check=True, timeout=30)
    got, seconds = proc.stdout.readline().split()
    proc.wait(10)
    return int(got), float(seconds)


@pytest.mark.skipif(netem.unavailable() is not None, reason=f"link emulator: {netem.unavailable()}")
def test_udp_and_tcp_alike_meet_the_bottleneck() -> None:
    bottleneck = netem.Bottleneck.for_path(10, 0.02, netem.SHALLOW_BDP)
    with netem.Link(Impairment(delay=0.01), tag=f"t{os.getpid() % 100000}", bottleneck=bottleneck) as link:
        meter = netem.CpuMeter({"forwarder": link.forwarder_pid or 0}).start()
        got, seconds = _through(link, _UDP_SINK, _UDP_BLAST)  # offered at twice the rate
        udp = link.stats()["a_to_b"]
        assert got * 8 / seconds == pytest.approx(10e6, rel=0.1)
        assert udp["dropped_bottleneck"] > 100  # the queue overflowed, UDP saw it
        assert udp["max_queued_bytes"] <= bottleneck.queue_bytes
        got, seconds = _through(link, _TCP_SINK, _TCP_BULK)
        tcp = link.stats()["a_to_b"]
        rate = got * 8 / seconds
        assert 6e6 <= rate <= 10.5e6, rate
        # TCP filled the queue and lost packets at it too (no local qdisc pushing back)
        assert tcp["dropped_bottleneck"] > udp["dropped_bottleneck"]
        assert "forwarder" in meter.stop()
        link.set_path(Impairment(delay=0.01), None)  # and the limit can be lifted
        assert link.stats()["a_to_b"]["packets"] >= tcp["packets"]
