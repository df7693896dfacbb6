"""Mesh verbs of the ``iac`` command: ``registry``, ``send``, ``request`` and ``call``.

``iac registry --key K --listen URL [--listen URL ...] [--store SPEC]`` runs a node
in the registry role over a record store (``sqlite:PATH``, the default
``sqlite:./iac-registry.db``; ``redis://HOST:PORT`` shared by several registries;
``memory``). It prints ``registry AGENT_ID``, ``store SPEC`` and one
``listening URL`` line per address, then serves until interrupted.

``iac send|request|call --key K --to ID|ALIAS [--addr URL ...] [--registry ID@URL ...]``
reach a peer by AgentId (with its addresses, or looked up in the registry) or by
alias (through the registry), re-resolving once after a failed dial:

* ``send --type RUN --payload JSON [--ack]`` sends one message and prints
  ``sent TO TYPE session_id=… msg_id=…`` (``acked`` once acknowledged; ``--timeout`` bounds the
  whole run, dial and ACK);
* ``request --type RUN --payload JSON`` prints the REPLY payload as JSON (``--type PING``: who
  answered and the round trip);
* ``call NAME [ARG_JSON ...] [--kwargs JSON]`` prints the remote function's result as JSON.

``--task JSON`` gives ``send`` and ``request`` a task envelope (``DELEGATE_TASK`` needs one):
``{"task_id": "t1", "intent": "ASSIGN_TASK", "step": 1, "steps": 3, "state_ref": "..."}``.

Errors are one line on stderr and a non-zero exit (``iac.cli.main.main``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from iac.cli import checks
from iac.cli.options import (
    MAX_LIFETIME,
    add_listen_option,
    add_registry_option,
    add_server_options,
    add_transport_options,
    integer,
    json_arg,
    payload_arg,
    print_listening,
    seconds,
    serve_until_signal,
    transport_config,
)
from iac.cli.serving import metrics_of, print_lines, running
from iac.errors import ConfigError, DeliveryError, StoreUnavailable
from iac.mesh import MeshClient, serve_registry
from iac.mesh.service import RegistryService
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.protocol.records import is_alias
from iac.protocol.registry import RegistryConfig, RegistryState
from iac.protocol.routing import RelayPolicy
from iac.stores.records import open_record_store
from iac.transport.base import TransportConfig
from iac.wire._pb.iac_pb2 import TaskState
from iac.wire.enums import Intent, MessageType, type_name
from iac.wire.identity import is_agent_id
from iac.wire.jsonutil import dumps_compact

DEFAULT_STORE = "sqlite:./iac-registry.db"
_NOT_SENDABLE = ("UNKNOWN", "REPLY", "ERROR", "ACK", "CANCEL", "COMMAND")
_TASK_EXAMPLE = """'{"task_id": "t1", "intent": "ASSIGN_TASK", "step": 1, "steps": 1}'"""


def _msg_type(name: str) -> int:
    key = name.strip().upper()
    if key.isdigit() and int(key) in set(MessageType):
        key = MessageType(int(key)).name
    names = [t.name for t in MessageType]
    if key not in names or key in _NOT_SENDABLE:
        allowed = ", ".join(k for k in names if k not in _NOT_SENDABLE)
        raise ConfigError(f"--type {name!r:.40}: not a message type to send; give one of {allowed}")
    return int(MessageType[key])


def _task(text: str | None, msg_type: int) -> TaskState | None:
    """The task envelope of ``--task JSON``; DELEGATE_TASK needs one."""
    if text is None:
        if msg_type == MessageType.DELEGATE_TASK:
            raise ConfigError(f"--type DELEGATE_TASK carries a task envelope: add --task {_TASK_EXAMPLE}")
        return None
    obj = json_arg(text, "--task")
    if not isinstance(obj, dict):
        raise ConfigError(f"--task must be a JSON object, e.g. --task {_TASK_EXAMPLE}")
    intents = ", ".join(i.name for i in Intent if i != Intent.INTENT_UNSPECIFIED)
    intent = obj.get("intent")
    if isinstance(intent, str) and intent not in Intent.__members__:
        raise ConfigError(f"--task: intent {intent!r:.40} is not one of {intents}")
    try:
        task = json_format.ParseDict(obj, TaskState())
    except json_format.ParseError as exc:
        raise ConfigError(
            f"--task: {str(exc).splitlines()[0][:120]}; the fields are task_id, intent, step, steps and "
            f"state_ref, e.g. --task {_TASK_EXAMPLE}"
        ) from None
    if not task.task_id:
        raise ConfigError(f"--task needs a task_id, e.g. --task {_TASK_EXAMPLE}")
    if int(task.intent) == int(Intent.INTENT_UNSPECIFIED):
        raise ConfigError(f"--task needs an intent, one of {intents}")
    if not 1 <= task.step <= task.steps:
        raise ConfigError(
            f"--task: step {task.step} of {task.steps}: give 1 <= step <= steps, e.g. step 1 of 1"
        )
    return task


def _client_config(args: argparse.Namespace) -> NodeConfig:
    """A client's node: it waits for nothing at close (the verb waited already), and no dial takes
    longer than ``--timeout``."""
    handshake = min(TransportConfig().handshake_timeout, args.timeout)
    transport = transport_config(args, handshake_timeout=handshake)
    return NodeConfig(transport=transport, request_timeout=args.timeout, drain_timeout=0.0)


# --- iac registry ---------------------------------------------------------------------------------


def _store_spec(spec: str) -> str:
    forms = "memory, sqlite:PATH or redis://HOST:PORT[/DB]"
    if spec == "memory":
        return spec
    if spec.startswith("sqlite:"):
        path = Path(spec.removeprefix("sqlite:"))
        if not str(path) or str(path) == ".":
            raise ConfigError(f"--store {spec}: give the database file, e.g. --store {DEFAULT_STORE}")
        if path.is_dir():
            raise ConfigError(
                f"--store {spec}: is a directory; name the database file in it, "
                f"e.g. sqlite:{path / 'registry.db'}"
            )
        if not path.parent.is_dir():
            raise ConfigError(
                f"--store {spec}: {path.parent} does not exist; create it first (mkdir -p {path.parent})"
            )
        return spec
    if spec.startswith(("redis://", "rediss://", "unix://")):
        try:
            importlib.import_module("redis")
        except ImportError:
            raise ConfigError(
                f"--store {spec}: needs the Redis client: pip install 'iac-mesh[redis]'"
            ) from None
        return spec
    raise ConfigError(f"--store {spec!r:.60}: not a registry store; give {forms}")


async def _run_registry(args: argparse.Namespace) -> int:
    identity = checks.load_key(args.key)
    listen = checks.listen_urls(args.listen)
    defaults = RegistryConfig()
    max_ttl_us = int(args.max_ttl * 1e6) if args.max_ttl is not None else defaults.max_ttl_us
    config = RegistryConfig(
        max_ttl_us=max_ttl_us,
        hold_us=max(defaults.hold_us, max_ttl_us),
        rotation_grace_us=int(args.grace * 1e6) if args.grace is not None else defaults.rotation_grace_us,
        max_keys=args.max_keys,
        forwarded_keys=args.forwarded_keys,
    )
    services: list[RegistryService] = []

    def admit(origin: str, to: str) -> bool:  # agents with a live record here, either end
        return bool(services) and (services[0].is_live(origin) or services[0].is_live(to))

    relay = RelayPolicy(
        relay_unicast=True,
        admit=admit,
        origin_rate=float(args.relay_rate),
        origin_burst=2 * args.relay_rate,
        origin_bytes=float(args.relay_bytes),
        origin_burst_bytes=4 * args.relay_bytes,
    )
    node_config = NodeConfig(transport=transport_config(args))
    if args.relay:
        node_config = dataclasses.replace(node_config, relay_policy=relay)
    metrics = metrics_of(args)
    store = open_record_store(_store_spec(args.store))
    try:
        state = RegistryState(store, config)
        try:
            state.count()  # a store that cannot answer now refuses the start, not the first lookup
        except StoreUnavailable as exc:
            raise ConfigError(f"--store {args.store}: {exc}") from None
        node = Node(identity, listen=listen, config=node_config, metrics=metrics)
        with checks.listen_errors(listen, metrics=getattr(args, "metrics", None)):
            await node.start()
        try:
            services.append(serve_registry(node, state))
            async with running(node, args, metrics) as lines:
                print(f"registry {identity.agent_id}", flush=True)
                print(f"store {args.store}", flush=True)
                print_listening(node.addresses)
                print_lines(lines)
                await serve_until_signal()
        finally:
            await node.close()
    finally:
        store.close()
    return 0


def _cmd_registry(args: argparse.Namespace) -> int:
    return asyncio.run(_run_registry(args))


# --- iac send / request / call --------------------------------------------------------------------


def _target(args: argparse.Namespace, has_registry: bool) -> str:
    to: str = args.to
    if args.via is not None:
        checks.agent_id("--via", args.via)
        if not args.addr and not has_registry:
            raise ConfigError(
                "--via AGENT_ID needs the relay's address: add --addr URL (or --registry ID@URL)"
            )
    if is_agent_id(to):
        if args.via is not None:
            return to
        if not args.addr and not has_registry:
            raise ConfigError("--to AGENT_ID needs the peer's address: add --addr URL (or --registry ID@URL)")
        return to
    if is_alias(to):
        if not has_registry:
            raise ConfigError(f"--to {to!r}: an alias is resolved by a registry: add --registry ID@URL")
        if args.addr and args.via is None:
            raise ConfigError("--addr goes with --to AGENT_ID; an alias's addresses come from the registry")
        return to
    if len(to) == 64:
        checks.agent_id("--to", to)  # 64 characters: meant as an AgentId; says why it is not one
    raise ConfigError(
        f"--to {to!r:.80}: neither a valid AgentId ({checks.AGENT_ID_TEXT}) nor an alias (lowercase "
        "labels joined by dots, e.g. writer.team-a)"
    )


@contextlib.asynccontextmanager
async def _client(args: argparse.Namespace) -> AsyncIterator[MeshClient]:
    identity = checks.load_key(args.key)
    registries = checks.registries(args.registry or ())
    to = _target(args, bool(registries))
    for url in args.addr:
        checks.address("--addr", url)
    bootstrap = {(args.via or to): list(args.addr)} if args.addr else None
    async with Node(identity, config=_client_config(args)) as node:
        mesh = MeshClient(
            node, registries=registries, bootstrap=bootstrap, publish=False, timeout=args.timeout
        )
        async with mesh:
            yield mesh


def _message(args: argparse.Namespace) -> tuple[int, Any, TaskState | None]:
    """The message type, JSON payload and task envelope of ``send`` and ``request``."""
    msg_type = _msg_type(args.type)
    payload = payload_arg(args.payload) if args.payload is not None else None
    return msg_type, payload, _task(args.task, msg_type)


async def _run_send(args: argparse.Namespace) -> int:
    msg_type, payload, task = _message(args)
    async with _client(args) as mesh:
        try:
            async with asyncio.timeout(args.timeout):
                if args.ack:  # dial first: a refused handshake is named (as ping and request do),
                    # not retried until the timeout behind "no ACK"
                    await mesh.node.connect(args.via or await mesh.resolve(args.to))
                sent = await mesh.send(args.to, msg_type, payload, ack=args.ack, task=task, via=args.via)
                if args.ack:
                    await sent.wait()
        except TimeoutError:
            what = "no ACK" if args.ack else "not sent"
            raise DeliveryError(
                f"{what} within {args.timeout:g} s; the peer is slow or unreachable: try a larger --timeout"
            ) from None
        print(
            f"sent {sent.peer} {type_name(msg_type)} session_id={sent.session_id:#x} "
            f"msg_id={sent.msg_id}" + (" acked" if args.ack else "")
        )
    return 0


async def _run_request(args: argparse.Namespace) -> int:
    msg_type, payload, task = _message(args)
    async with _client(args) as mesh:
        t0 = time.perf_counter()
        reply = await mesh.request(args.to, msg_type, payload, timeout=args.timeout, task=task, via=args.via)
        took = (time.perf_counter() - t0) * 1000.0
        if msg_type == MessageType.PING and reply.payload is None:
            print(f"PING answered by {reply.sender} in {took:.3f} ms (with connection set-up)")
        else:
            print(dumps_compact(reply.payload))
    return 0


async def _run_call(args: argparse.Namespace) -> int:
    call_args = [json_arg(a, f"argument {i + 1}") for i, a in enumerate(args.args)]
    kwargs = json_arg(args.kwargs, "--kwargs") if args.kwargs is not None else {}
    if not isinstance(kwargs, dict):
        raise ConfigError("""--kwargs must be a JSON object, e.g. --kwargs '{"text": "hi"}'""")
    async with _client(args) as mesh:
        result = await mesh.invoke(args.to, args.name, call_args, kwargs, timeout=args.timeout, via=args.via)
        print(dumps_compact(result))
    return 0


def _sync(
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    def cmd(args: argparse.Namespace) -> int:
        return int(asyncio.run(run(args)))

    return cmd


def _add_target_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key", required=True, help="agent key file")
    p.add_argument("--to", required=True, metavar="ID|ALIAS", help="the peer's AgentId or alias")
    p.add_argument(
        "--addr", action="append", default=[], metavar="URL", help="the peer's address (repeatable)"
    )
    add_registry_option(p, "registry to resolve through: AGENT_ID@ADDRESS (repeatable)")
    p.add_argument(
        "--via",
        default=None,
        metavar="AGENT_ID",
        help="send through this relay (a node that relays unicast for others); --addr is then the "
        "relay's address, or the relay is a --registry (default: directly)",
    )
    p.add_argument(
        "--timeout",
        type=seconds(example="10"),
        default=10.0,
        help="seconds to wait for the answer (default %(default)g)",
    )
    add_transport_options(p)


def _add_message_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--type", default="RUN", help="message type name or number (default RUN)")
    p.add_argument(
        "--payload",
        default=None,
        metavar="JSON",
        help="JSON payload; @FILE reads it from FILE, - from standard input (at most 4 MiB)",
    )
    p.add_argument(
        "--task",
        default=None,
        metavar="JSON",
        help="task envelope (DELEGATE_TASK needs one): task_id, intent, step, steps, state_ref",
    )


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the mesh verbs to the ``iac`` parser."""
    p = sub.add_parser("registry", help="run a registry node (signed records, aliases, capabilities)")
    p.add_argument("--key", required=True, help="agent key file")
    add_listen_option(p)
    p.add_argument(
        "--store",
        default=DEFAULT_STORE,
        metavar="SPEC",
        help=f"sqlite:PATH, redis://HOST:PORT[/DB] or memory (default {DEFAULT_STORE})",
    )
    p.add_argument(
        "--max-ttl",
        type=seconds(maximum=MAX_LIFETIME, example="604800"),
        default=None,
        metavar="SECONDS",
        help="longest record lifetime, at most a year (default: a week)",
    )
    p.add_argument(
        "--grace",
        type=seconds(maximum=MAX_LIFETIME, zero=True, example="3600"),
        default=None,
        metavar="SECONDS",
        help="how long a rotated key stays valid (default: an hour)",
    )
    p.add_argument(
        "--max-keys",
        type=integer(what="number of keys"),
        default=RegistryConfig().max_keys,
        metavar="N",
        help="most keys held (rotated and revoked ones count); when full, a direct publish of a new "
        "key evicts one that the neighbour which relayed the most brought in (default %(default)d)",
    )
    p.add_argument(
        "--forwarded-keys",
        type=integer(what="number of keys"),
        default=RegistryConfig().forwarded_keys,
        metavar="N",
        help="most new keys one neighbour connection may bring in per hour by FORWARD (relayed "
        "publishes); beyond, refused with registry_quota and counted (default %(default)d)",
    )
    p.add_argument(
        "--relay",
        action="store_true",
        help="relay unicast messages to and from agents with a live record here (the NAT path: "
        "`send`/`request`/`call --via` this registry), each origin within --relay-rate and "
        "--relay-bytes (default: no relaying)",
    )
    p.add_argument(
        "--relay-rate",
        type=integer(what="messages per second"),
        default=50,
        metavar="N",
        help="with --relay: messages per second relayed for one origin, bursts of twice that "
        "(default %(default)d)",
    )
    p.add_argument(
        "--relay-bytes",
        type=integer(what="bytes per second"),
        default=1024 * 1024,
        metavar="BYTES",
        help="with --relay: bytes per second relayed for one origin, bursts of four times that "
        "(default %(default)d)",
    )
    add_transport_options(p)
    add_server_options(p)
    p.set_defaults(func=_cmd_registry)

    p = sub.add_parser("send", help="send one message to a peer (by AgentId or alias)")
    _add_target_options(p)
    _add_message_options(p)
    p.add_argument("--ack", action="store_true", help="request an ACK and wait for it")
    p.set_defaults(func=_sync(_run_send))

    p = sub.add_parser("request", help="send a request and print the reply's JSON payload")
    _add_target_options(p)
    _add_message_options(p)
    p.set_defaults(func=_sync(_run_request))

    p = sub.add_parser("call", help="call a function a peer exposed and print its JSON result")
    _add_target_options(p)
    p.add_argument("name", help="the exposed function's name")
    p.add_argument("args", nargs="*", metavar="ARG_JSON", help="positional arguments, each one JSON value")
    p.add_argument("--kwargs", default=None, metavar="JSON", help="keyword arguments as a JSON object")
    p.set_defaults(func=_sync(_run_call))


__all__ = ["DEFAULT_STORE", "register"]
