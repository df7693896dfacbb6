"""The CLI speaks with the shipped dictionary: ``iac node`` and ``iac request`` as real processes
announce ``dict_ids`` [39616] in their HELLOs, and the frames between them are compressed with it,
as a wiretap between the two sees."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from iac.testing.tap import DOWN, UP, UnixTap
from iac.wire._pb.iac_pb2 import Hello
from iac.wire.dicts import default_dictionary
from iac.wire.frames import FrameType

SHIPPED_ID = 39616
#: Large enough that compressing pays (a sender compresses only when that makes the frame smaller).
PAYLOAD = '{"task": "summarize", "text": "' + "the quarterly report of the agent mesh; " * 8 + '"}'
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="iac-run-")}


def _iac(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iac", *args], capture_output=True, text=True, timeout=60, env=ENV
    )


async def _request_through_tap(tmp: Path) -> tuple[UnixTap, int | None, str]:
    """``iac request --type PING`` from one process to ``iac node`` in another, through a tap."""
    for name in ("server", "client"):
        assert _iac("keygen", "--out", str(tmp / f"{name}.key")).returncode == 0
    sock_dir = Path(tempfile.mkdtemp(prefix="iac-dict-"))
    node = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "iac",
        "node",
        "--key",
        str(tmp / "server.key"),
        "--no-admin",
        "--listen",
        f"unix://{sock_dir}/node.sock",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=ENV,
    )
    try:
        assert node.stdout is not None
        first = (await asyncio.wait_for(node.stdout.readline(), 30)).decode().split()
        assert first[:1] == ["node"], first
        kind, url = (await asyncio.wait_for(node.stdout.readline(), 30)).decode().split()
        assert kind == "listening"
        async with UnixTap(url) as tap:
            req = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "iac",
                "request",
                "--key",
                str(tmp / "client.key"),
                "--to",
                first[1],
                "--addr",
                tap.url,
                "--type",
                "PING",
                "--payload",
                PAYLOAD,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=ENV,
            )
            out, err = await asyncio.wait_for(req.communicate(), 60)
        return tap, req.returncode, out.decode() + err.decode()
    finally:
        node.terminate()
        await asyncio.wait_for(node.wait(), 30)
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_cli_hello_announces_and_frames_use_the_shipped_dictionary(tmp_path: Path) -> None:
    assert default_dictionary().dict_id == SHIPPED_ID
    tap, returncode, output = asyncio.run(_request_through_tap(tmp_path))
    assert returncode == 0, output
    assert tap.errors == []
    hellos = tap.tapped(ftype=FrameType.HELLO)
    assert {t.direction for t in hellos} == {UP, DOWN}
    for t in hellos:
        assert list(Hello.FromString(t.frame.body).dict_ids) == [SHIPPED_ID], t.direction
    messages = tap.tapped(ftype=FrameType.MESSAGE)
    requests = [t for t in messages if t.direction == UP]
    assert len(requests) == 1
    assert json.loads(requests[0].message().payload_json) == json.loads(PAYLOAD)
    # The request travelled compressed with the shipped dictionary, and so did every other frame
    # that was compressed at all (a tiny one, such as the REPLY ``null``, goes raw).
    assert requests[0].frame.dict_id == SHIPPED_ID
    assert {t.frame.dict_id for t in tap.frames} <= {None, SHIPPED_ID}
    assert [t.direction for t in messages] == [UP, DOWN]
