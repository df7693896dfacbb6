"""A private ``redis-server`` on a free loopback port, for tests (CI installs the binary)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from ports import free_port


class RedisServer:
    """A ``redis-server`` subprocess on a loopback port, without persistence."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(
                "redis-server is not installed: the Redis replay store tests need it "
                "(apt-get install -y redis-server; .ci/run installs it)",
                pytrace=False,
            )
        self.binary = binary
        self.workdir = workdir
        self.port = port if port is not None else free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> bool:
        import redis

        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--logfile",
                f"redis-{self.port}.log",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        try:
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    return bool(client.ping())
                except redis.exceptions.ConnectionError:
                    time.sleep(0.02)
        finally:
            client.close()
        self.stop()
        return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


def start_redis(workdir: Path) -> RedisServer:
    for _attempt in range(3):  # a probed free port can be taken before redis binds it: try another
        server = RedisServer(workdir)
        if server.start():
            return server
    pytest.fail(f"redis-server did not answer PING; see the logs in {workdir}", pytrace=False)
