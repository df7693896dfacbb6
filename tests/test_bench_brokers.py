"""The NATS and ZeroMQ contenders of the benchmark suite, as real endpoint processes: every request
is answered by its own reply, one-way messages all arrive, the signed variants refuse a reply that
another key signed, and the NATS server endpoint stops the nats-server it started."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import nacl.exceptions
import pytest

from iac.bench.contenders import brokers, endpoints


@pytest.mark.parametrize("name", sorted(brokers.KINDS))
def test_requests_and_one_way_messages_through_each_broker(name: str, tmp_path: Path) -> None:
    pair = endpoints.start_pair(name, "127.0.0.1", tmp_path)
    try:
        out = pair.run(8, 60)
        assert out["errors"] == 0 and len(out["lat_us"]) == 60
        assert out["server_handled"] == 60  # each request reached the server once
        one = pair.oneway(150)
        assert one["count"] == 150 and one["elapsed_s"] > 0
        again = pair.run(1, 5)  # the one-way messages did not leave replies behind
        assert again["errors"] == 0 and again["server_handled"] == 5
    finally:
        pair.close()


def test_a_reply_signed_by_another_key_is_refused() -> None:
    server = brokers.Codec(True, endpoints.SERVER_SEED, endpoints.CLIENT_SEED, json.dumps(endpoints.REPLY))
    impostor = brokers.Codec(True, bytes(32), endpoints.CLIENT_SEED, json.dumps(endpoints.REPLY))
    request = brokers.seal("{}", 7, brokers.keys(True, endpoints.CLIENT_SEED, endpoints.SERVER_SEED)[0])
    _, client_verifier = brokers.keys(True, endpoints.CLIENT_SEED, endpoints.SERVER_SEED)
    good, bad = server.answer(request), impostor.answer(request)
    assert good is not None and bad is not None
    assert brokers.unseal(good, client_verifier)["msg_id"] == 7
    with pytest.raises(nacl.exceptions.BadSignatureError):
        brokers.unseal(bad, client_verifier)
    with pytest.raises(KeyError):  # an unsigned envelope where a signed one is expected
        brokers.unseal(brokers.seal("{}", 7, None), client_verifier)


def test_the_nats_endpoint_stops_the_server_it_started(tmp_path: Path) -> None:
    pair = endpoints.start_pair("nats", "127.0.0.1", tmp_path)
    host, port = pair.server.first["target"]["url"].removeprefix("nats://").split(":")
    with socket.create_connection((host, int(port)), timeout=5):
        pass
    pair.close()
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=5):
        pass


def test_without_nats_server_the_row_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert brokers.missing("nats") == "nats-server not found — apt-get install nats-server"
    assert brokers.missing("zmq") is None
