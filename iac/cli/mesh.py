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
  ``sent TO TYPE session_id=… msg_id=…`` (``acked`` once acknowledged);
* ``request --type RUN --payload JSON`` prints the REPLY payload as JSON;
* ``call NAME [ARG_JSON ...] [--kwargs JSON]`` prints the remote function's result as JSON.

Errors are one line on stderr and a non-zero exit (``iac.cli.main.main``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from iac.cli.options import (
    add_listen_option,
    add_registry_option,
    add_tls_options,
    json_arg,
    print_listening,
    serve_until_signal,
    transport_config,
)
from iac.errors import ConfigError, DeliveryError, IacError
from iac.mesh import MeshClient, parse_registry, serve_registry
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.protocol.records import is_alias
from iac.protocol.registry import RegistryConfig, RegistryState
from iac.stores.records import open_record_store
from iac.wire.enums import MessageType, type_name
from iac.wire.identity import Identity, is_agent_id
from iac.wire.jsonutil import dumps_compact

DEFAULT_STORE = "sqlite:./iac-registry.db"
_NOT_SENDABLE = ("UNKNOWN", "REPLY", "ERROR", "ACK", "CANCEL", "COMMAND")


def _msg_type(name: str) -> int:
    key = name.strip().upper()
    if key.isdigit() and int(key) in set(MessageType):
        key = MessageType(int(key)).name
    names = [t.name for t in MessageType]
    if key not in names or key in _NOT_SENDABLE:
        allowed = ", ".join(k for k in names if k not in _NOT_SENDABLE)
        raise ConfigError(f"--type {name!r}: not a message type to send (one of {allowed})")
    return int(MessageType[key])


def _node_config(args: argparse.Namespace) -> NodeConfig:
    base = NodeConfig()
    transport = transport_config(args)
    timeout = getattr(args, "timeout", None) or base.request_timeout
    return dataclasses.replace(base, transport=transport, request_timeout=timeout)


# --- iac registry ---------------------------------------------------------------------------------


async def _run_registry(args: argparse.Namespace) -> int:
    identity = Identity.load(args.key)
    defaults = RegistryConfig()
    try:
        config = RegistryConfig(
            max_ttl_us=int(args.max_ttl * 1e6) if args.max_ttl else defaults.max_ttl_us,
            hold_us=max(defaults.hold_us, int(args.max_ttl * 1e6) if args.max_ttl else 0),
            rotation_grace_us=int(args.grace * 1e6) if args.grace is not None else defaults.rotation_grace_us,
        )
    except (OverflowError, ValueError) as exc:
        raise ConfigError(f"bad registry limits: {exc}") from None
    store = open_record_store(args.store)
    try:
        state = RegistryState(store, config)
        async with Node(identity, listen=args.listen, config=_node_config(args)) as node:
            serve_registry(node, state)
            print(f"registry {identity.agent_id}", flush=True)
            print(f"store {args.store}", flush=True)
            print_listening(node.addresses)
            await serve_until_signal()
    finally:
        store.close()
    return 0


def _cmd_registry(args: argparse.Namespace) -> int:
    return asyncio.run(_run_registry(args))


# --- iac send / request / call --------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _client(args: argparse.Namespace) -> AsyncIterator[MeshClient]:
    identity = Identity.load(args.key)
    registries = parse_registry(args.registry or ())
    to = args.to
    if is_agent_id(to):
        if not args.addr and not registries:
            raise ConfigError("--to AGENT_ID needs --addr URL or --registry ID@URL")
    elif is_alias(to):
        if not registries:
            raise ConfigError(f"--to {to!r} is an alias: resolving it needs --registry ID@URL")
        if args.addr:
            raise ConfigError("--addr goes with --to AGENT_ID (an alias's addresses come from the registry)")
    else:
        raise ConfigError(f"--to {to!r:.80} is neither an AgentId (64 lowercase hex) nor an alias")
    bootstrap = {to: list(args.addr)} if args.addr else None
    async with Node(identity, config=_node_config(args)) as node:
        mesh = MeshClient(
            node, registries=registries, bootstrap=bootstrap, publish=False, timeout=args.timeout
        )
        async with mesh:
            yield mesh


def _message(args: argparse.Namespace) -> tuple[int, Any]:
    """The message type and JSON payload of ``send`` and ``request`` (see :func:`_add_message_options`)."""
    payload = json_arg(args.payload, "--payload") if args.payload is not None else None
    return _msg_type(args.type), payload


async def _run_send(args: argparse.Namespace) -> int:
    msg_type, payload = _message(args)
    async with _client(args) as mesh:
        sent = await mesh.send(args.to, msg_type, payload, ack=args.ack)
        if args.ack:
            try:
                await asyncio.wait_for(sent.wait(), args.timeout)
            except TimeoutError:
                raise DeliveryError(f"no ACK within {args.timeout:g} s") from None
        print(
            f"sent {sent.peer} {type_name(msg_type)} session_id={sent.session_id:#x} "
            f"msg_id={sent.msg_id}" + (" acked" if args.ack else "")
        )
    return 0


async def _run_request(args: argparse.Namespace) -> int:
    msg_type, payload = _message(args)
    async with _client(args) as mesh:
        reply = await mesh.request(args.to, msg_type, payload, timeout=args.timeout)
        print(dumps_compact(reply.payload))
    return 0


async def _run_call(args: argparse.Namespace) -> int:
    call_args = [json_arg(a, f"argument {i + 1}") for i, a in enumerate(args.args)]
    kwargs = json_arg(args.kwargs, "--kwargs") if args.kwargs is not None else {}
    if not isinstance(kwargs, dict):
        raise ConfigError("--kwargs must be a JSON object")
    async with _client(args) as mesh:
        result = await mesh.invoke(args.to, args.name, call_args, kwargs, timeout=args.timeout)
        print(dumps_compact(result))
    return 0


def _sync(
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    def cmd(args: argparse.Namespace) -> int:
        if args.timeout <= 0:
            raise ConfigError("--timeout must be positive")
        try:
            return int(asyncio.run(run(args)))
        except IacError:
            raise
        except (ValueError, TypeError) as exc:  # anything left that a bad argument can cause
            raise ConfigError(str(exc)) from None

    return cmd


def _add_target_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key", required=True, help="agent key file")
    p.add_argument("--to", required=True, metavar="ID|ALIAS", help="the peer's AgentId or alias")
    p.add_argument(
        "--addr", action="append", default=[], metavar="URL", help="the peer's address (repeatable)"
    )
    add_registry_option(p, "registry to resolve through: AGENT_ID@ADDRESS (repeatable)")
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the answer (default %(default)g)"
    )
    add_tls_options(p)


def _add_message_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--type", default="RUN", help="message type name or number (default RUN)")
    p.add_argument("--payload", default=None, metavar="JSON", help="JSON payload")


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
    p.add_argument("--max-ttl", type=float, default=None, metavar="SECONDS", help="longest record lifetime")
    p.add_argument(
        "--grace", type=float, default=None, metavar="SECONDS", help="how long a rotated key stays valid"
    )
    add_tls_options(p)
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
