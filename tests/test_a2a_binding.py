"""The binding's sans-IO core: interface URLs, calls and answers, errors, principals, the gateway's
credentials. No node, no socket."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("a2a")

from a2a.client.errors import A2AClientError
from a2a.types import AgentCard, GetTaskRequest, SendMessageResponse, StreamResponse, Task
from a2a.utils.errors import (
    InvalidAgentResponseError,
    InvalidParamsError,
    InvalidRequestError,
    MethodNotFoundError,
    TaskNotFoundError,
    VersionNotSupportedError,
)

from iac import Identity
from iac.errors import ConfigError
from iac.integrations import a2a as ia
from iac.integrations.a2a import binding as b

A = Identity.from_seed(b"a" * 32).agent_id
B = Identity.from_seed(b"b" * 32).agent_id


def test_interface_urls_round_trip_and_refuse_what_is_not_one():
    addrs = ["quic://127.0.0.1:4433", "tls://[::1]:4433", "unix:///run/iac/a b.sock"]
    url = ia.interface_url(A, addrs)
    assert url.startswith(f"iac://{A}?addr=quic://127.0.0.1:4433&addr=tls://[::1]:4433&addr=unix:///run/")
    assert ia.parse_interface_url(url) == ia.Endpoint(A, tuple(addrs))
    assert ia.parse_interface_url(f"iac://{A}") == ia.Endpoint(A, ())
    for bad in (
        f"http://{A}",
        "iac://not-an-agent-id",
        f"iac://{A}/path",
        f"iac://{A}?addr=http://x:1",
        f"iac://{A}?other=1",
        f"iac://{A}#frag",
        f"iac://{A}?" + "&".join(["addr=tls://h:1"] * 17),
    ):
        with pytest.raises(ConfigError):
            ia.parse_interface_url(bad)
    with pytest.raises(ConfigError):
        ia.interface_url("nope", [])


def test_a_card_served_over_iac_names_only_its_own_agent():
    card = AgentCard(name="x")
    card.supported_interfaces.append(ia.iac_interface(B, ["tls://h:1"]))
    card.supported_interfaces.add(protocol_binding="JSONRPC", url="http://h/")
    mine = ia.with_iac_interface(card, A, ["quic://h:2"])
    assert [b.iac_endpoints(mine)[0].agent_id] == [A]
    assert [i.protocol_binding for i in mine.supported_interfaces] == ["IAC", "JSONRPC"]
    again = ia.with_iac_interface(mine, A, ["quic://other:3"])
    assert list(again.supported_interfaces) == list(mine.supported_interfaces)  # kept, not doubled
    assert card.supported_interfaces[0].url.startswith(f"iac://{B}")  # the input is not changed


def test_calls_encode_and_decode_and_refuse_as_json_rpc_would():
    payload = b.call_payload("GetTask", GetTaskRequest(id="t-1"), extensions=["urn:x", "urn:a"])
    assert payload == {
        "a2a": "1.0",
        "method": "GetTask",
        "params": {"id": "t-1"},
        "extensions": ["urn:a", "urn:x"],
    }
    call = b.parse_call(payload)
    assert call.method.name == "GetTask" and call.params.id == "t-1" and call.extensions == {"urn:a", "urn:x"}
    assert b.parse_call({"a2a": "1.0.7", "method": "GetTask"}).version == "1.0.7"  # a patch level is ignored
    cases = [
        ("x", InvalidRequestError),
        ({"method": "GetTask"}, InvalidRequestError),
        ({"a2a": 1, "method": "GetTask"}, InvalidRequestError),
        ({"a2a": "0.3", "method": "GetTask"}, VersionNotSupportedError),
        ({"a2a": "2.0", "method": "GetTask"}, VersionNotSupportedError),
        ({"a2a": "1.0", "method": "tasks/get"}, MethodNotFoundError),
        ({"a2a": "1.0", "method": "GetTask", "params": "x"}, InvalidParamsError),
        ({"a2a": "1.0", "method": "GetTask", "params": {"historyLength": "many"}}, InvalidParamsError),
        ({"a2a": "1.0", "method": "GetTask", "extensions": "urn:x"}, InvalidRequestError),
    ]
    for payload, error in cases:
        with pytest.raises(error):
            b.parse_call(payload)
    with pytest.raises(ConfigError):
        b.call_payload("message/send", GetTaskRequest())


def test_answers_carry_results_and_a2a_errors_both_ways():
    task = Task(id="t-1", context_id="c")
    assert b.parse_answer(b.result_payload(task), Task()) == task
    assert b.parse_answer(b.result_payload(None), None) is None
    part = b.error_payload(TaskNotFoundError(data={"task": "t-1"}))
    assert part["error"]["code"] == -32001
    with pytest.raises(TaskNotFoundError) as err:
        b.parse_answer(part, Task())
    assert err.value.data == {"task": "t-1"}
    assert b.error_name(-32001) == "TaskNotFoundError" and b.error_name(7) == "error 7"
    assert isinstance(b.answer_error({"error": {"code": 12345, "message": "odd"}}), A2AClientError)
    for bad in ({"neither": 1}, {"result": [1]}, {"result": {"task": 5}}, {"error": "text"}, []):
        with pytest.raises((InvalidAgentResponseError, A2AClientError)):
            b.parse_answer(bad, SendMessageResponse())
    assert b.parse_answer({"result": {"task": {"id": "t"}}}, StreamResponse()).task.id == "t"


def test_principals_are_bounded():
    assert b.check_principal("alice@example.org") == "alice@example.org"
    assert b.check_principal("é" * 128)  # 256 bytes of UTF-8
    for bad in ("é" * 129, "a\nb", "a\x7fb"):
        with pytest.raises(ConfigError):
            b.check_principal(bad)


def test_gateway_credentials(tmp_path):
    auth = ia.GatewayAuth.bearer({"a-token-that-is-long-1": "alice", "b-token-that-is-long-2": "bob"})
    assert auth.authenticate({"authorization": "Bearer a-token-that-is-long-1"}) == "alice"
    assert auth.authenticate({"authorization": "bearer b-token-that-is-long-2"}) == "bob"
    for headers in ({}, {"authorization": "Basic a-token-that-is-long-1"}, {"authorization": "Bearer x"}):
        assert auth.authenticate(headers) is None
    key = ia.GatewayAuth.api_key({"a-token-that-is-long-1": "alice"}, header="X-Key")
    assert key.authenticate({"x-key": "a-token-that-is-long-1"}) == "alice"
    assert key.authenticate({"authorization": "Bearer a-token-that-is-long-1"}) is None
    card = AgentCard(name="x")
    key.declare(card)
    assert card.security_schemes["iacGateway"].api_key_security_scheme.name == "X-Key"
    assert list(card.security_requirements[0].schemes) == ["iacGateway"]
    with pytest.raises(ConfigError):
        ia.GatewayAuth.bearer({})
    with pytest.raises(ConfigError):
        ia.GatewayAuth.bearer({"short": "alice"})
    with pytest.raises(ConfigError):
        ia.GatewayAuth({"a-token-that-is-long-1": "alice"}, scheme="basic")
    f = tmp_path / "tokens"
    f.write_text("# who token\nalice a-token-that-is-long-1\n\nbob b-token-that-is-long-2  # bob's\n")
    os.chmod(f, 0o600)
    assert (
        ia.GatewayAuth.from_file(f).authenticate({"authorization": "Bearer b-token-that-is-long-2"}) == "bob"
    )
    os.chmod(f, 0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        ia.GatewayAuth.from_file(f)
    f.write_text("alice\n")
    os.chmod(f, 0o600)
    with pytest.raises(ConfigError, match="PRINCIPAL SECRET"):
        ia.GatewayAuth.from_file(f)
