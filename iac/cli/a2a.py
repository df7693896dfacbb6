"""``iac a2a``: A2A over IAC from the command line (``pip install 'iac-mesh[a2a]'``).

``iac a2a gateway --key K --listen http://HOST:PORT --to AGENT --addr URL --tokens FILE``
publishes the A2A agent behind IAC agent ``AGENT`` to plain A2A clients: its card at
``/.well-known/agent-card.json`` and A2A's JSON-RPC (and SSE) at ``/``. Callers authenticate with
a bearer token (``--tokens``) or an API key (``--api-keys``, header ``--api-key-header``); both
files hold ``PRINCIPAL SECRET`` lines and must be private (mode 0600). Each call is forwarded
signed by the gateway's key, the caller's principal in Message field 19. It prints
``gateway URL``, ``card URL`` and ``node ID`` (and ``status PATH``, ``metrics URL``), serves until
interrupted, then prints its counters. Its bounds per tenant and in total are in ``--help``.

``iac a2a bridge --key K --listen URL --to http://HOST:PORT`` the other way: a node that answers
A2A over IAC for the HTTP A2A agent at that URL (``--bearer-token-file`` for the HTTP leg).

``iac a2a card --key K --to AGENT --addr URL`` prints the agent's A2A card (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from iac.cli import checks
from iac.cli.options import (
    add_listen_option,
    add_server_options,
    add_transport_options,
    integer,
    print_error,
    print_listening,
    seconds,
    serve_until_signal,
    transport_config,
)
from iac.cli.serving import metrics_of, print_lines, running
from iac.errors import ConfigError, IacError
from iac.node.config import NodeConfig
from iac.node.node import Node


def _a2a() -> Any:
    try:
        from iac.integrations import a2a
    except ImportError:
        raise ConfigError("iac a2a needs the A2A SDK: pip install 'iac-mesh[a2a]'") from None
    return a2a


def _run(main: Any) -> Callable[[argparse.Namespace], int]:
    """Run a verb; an A2A error (a2a-sdk's, not an IacError) is one line and exit 1 too."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(asyncio.run(main(args)))
        except Exception as exc:
            if type(exc).__module__.startswith(("a2a.", "iac.integrations.a2a")) and not isinstance(
                exc, IacError
            ):
                print_error(f"a2a {args.a2a_verb}", exc)
                return 1
            raise

    return run


def https_files(cert: str | None, key: str | None) -> None:
    """``--https-cert`` and ``--https-key``: both or neither, and a PEM certificate with its key
    (loaded here, so that a missing or bad file is one line, not the HTTP server's traceback)."""
    if cert is None and key is None:
        return
    if cert is None or key is None:
        raise ConfigError("--https-cert and --https-key go together: give the certificate and its key (PEM)")
    for flag, path in (("--https-cert", cert), ("--https-key", key)):
        if not Path(path).is_file():
            what = "is a directory" if Path(path).is_dir() else "no such file"
            raise ConfigError(f"{flag} {path}: {what}; give a PEM file")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"--https-cert {cert} --https-key {key}: not a PEM certificate and its private key"
            f"{f' ({exc.reason})' if exc.reason and exc.reason != 'PEM lib' else ''}; "
            "make a pair with iac certs init"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"--https-cert {cert}: cannot read it ({exc.strerror}); check its permissions"
        ) from None


def _node(args: argparse.Namespace, listen: list[str] | None = None, metrics: Any = None) -> Node:
    identity = checks.load_key(args.key)
    config = NodeConfig(transport=transport_config(args))
    return Node(identity, listen=checks.listen_urls(listen) if listen else [], config=config, metrics=metrics)


async def run_gateway(args: argparse.Namespace) -> int:
    checks.agent_id("--to", args.to)
    a2a = _a2a()
    if bool(args.tokens) == bool(args.api_keys):
        raise ConfigError("give exactly one of --tokens FILE (bearer) and --api-keys FILE")
    https_files(args.https_cert, args.https_key)
    if args.tokens:
        auth = a2a.GatewayAuth.from_file(args.tokens, "bearer")
    else:
        auth = a2a.GatewayAuth.from_file(args.api_keys, "apikey", args.api_key_header)
    limits = a2a.GatewayLimits(
        max_calls=args.max_calls, max_calls_per_principal=min(args.max_calls_per_principal, args.max_calls),
        max_connections=args.max_connections, max_per_address=args.max_connections_per_address,
    )  # fmt: skip
    metrics = metrics_of(args)
    async with _node(args, metrics=metrics) as node:
        gateway = a2a.A2AGateway(
            node, args.to, addresses=args.addr, auth=auth, listen=args.listen, max_body=args.max_body,
            timeout=args.timeout, advertise_iac=not args.no_advertise_iac,
            tls_cert=args.https_cert, tls_key=args.https_key, limits=limits,
        )  # fmt: skip
        async with gateway, running(node, args, metrics) as lines:
            if metrics is not None:
                metrics.registry.register(a2a.GatewayCollector(gateway.stats))
            print(f"gateway {gateway.url}", flush=True)
            print(f"card {gateway.url}.well-known/agent-card.json", flush=True)
            print(f"node {node.agent_id}", flush=True)
            print_lines(lines)
            await serve_until_signal()
            print(f"stats {json.dumps(gateway.stats(), sort_keys=True)}", flush=True)
    return 0


def _http_url(flag: str, url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{flag} {url!r:.80}: give the agent's base URL, http://HOST:PORT or https://HOST:PORT"
        )
    return url


def _token(path: str) -> str:
    p = Path(path)
    try:
        token = p.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise ConfigError(
            f"--bearer-token-file {path}: no such file; write the token into it (mode 0600)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(
            f"--bearer-token-file {path}: cannot read it ({why}); give a text file with the token"
        ) from None
    if not token:
        raise ConfigError(f"--bearer-token-file {path}: is empty; write the token into it")
    return token


async def run_bridge(args: argparse.Namespace) -> int:
    _http_url("--to", args.to)
    headers = {}
    if args.bearer_token_file:
        headers["Authorization"] = f"Bearer {_token(args.bearer_token_file)}"
    for gateway in args.trust_gateway:
        checks.agent_id("--trust-gateway", gateway)
    a2a = _a2a()
    import httpx

    http = httpx.AsyncClient(headers=headers, timeout=args.timeout)
    async with _node(args, args.listen) as node, http:
        bridge = await a2a.serve_remote(node, args.to, http=http, trusted_gateways=args.trust_gateway)
        print(f"node {node.agent_id}", flush=True)
        print_listening(node.addresses)
        print(f"bridging {args.to}", flush=True)
        await serve_until_signal()
        print(f"stats {json.dumps(bridge.server.stats(), sort_keys=True)}", flush=True)
    return 0


async def run_card(args: argparse.Namespace) -> int:
    checks.agent_id("--to", args.to)
    a2a = _a2a()
    from a2a.utils.errors import InvalidAgentResponseError
    from google.protobuf.json_format import MessageToDict

    async with _node(args) as node:
        try:
            card = await a2a.fetch_card(node, args.to, *args.addr, timeout=args.timeout)
        except InvalidAgentResponseError:  # it answers RUN, but not as A2A over IAC does
            raise ConfigError(
                f"{args.to[:16]}… serves no A2A over IAC: it answers RUN, but not with an A2A answer "
                "(an A2A agent serves with iac.integrations.a2a.serve, or iac a2a bridge)"
            ) from None
    print(json.dumps(MessageToDict(card), indent=2))
    return 0


def register(sub: Any) -> None:
    """Add ``iac a2a gateway|bridge|card`` to the ``iac`` sub-command parsers."""
    p = sub.add_parser("a2a", help="A2A over IAC: an HTTP gateway, a bridge, an agent's card")
    verbs = p.add_subparsers(dest="a2a_verb", metavar="VERB", required=True)

    g = verbs.add_parser(
        "gateway",
        help="serve A2A JSON-RPC over HTTP in front of an IAC agent",
        description="Serve A2A JSON-RPC (and SSE) over HTTP in front of an IAC agent, to A2A 1.0 "
        "and A2A 0.3 clients on the same URL (a request without an A2A-Version header is 0.3). Bounds, per "
        "tenant and in total: a request head within 10 s; a body at 1 KiB/s or more; an idle "
        "kept-alive connection 75 s; --max-connections in total (lowered to fit the descriptor "
        "limit) and --max-connections-per-address; request bodies in flight 64 MiB in total and "
        "8 MiB per client address; --max-calls toward the agent, --max-calls-per-principal of them "
        "for one principal, a call beyond waits at most 5 s (256 wait at most) then gets HTTP 429; "
        "a repeated messageId from the same principal within 10 minutes (256 per principal) is "
        "answered from the first answer, not run again.",
    )
    g.add_argument("--key", required=True, help="the gateway's key file (it signs what it forwards)")
    g.add_argument("--listen", required=True, metavar="URL", help="http://HOST:PORT (or https://)")
    g.add_argument("--to", required=True, metavar="AGENT", help="the IAC agent's AgentId")
    g.add_argument("--addr", action="append", default=[], metavar="URL", help="an address of the agent")
    g.add_argument("--tokens", default=None, metavar="FILE", help="bearer tokens: PRINCIPAL TOKEN lines")
    g.add_argument("--api-keys", default=None, metavar="FILE", help="API keys: PRINCIPAL KEY lines")
    g.add_argument("--api-key-header", default="X-API-Key", help="the API key's header (default X-API-Key)")
    g.add_argument(
        "--max-body",
        type=integer(minimum=1, what="size in bytes"),
        default=1 << 20,
        help="largest request body (bytes)",
    )
    g.add_argument(
        "--timeout", type=seconds(example="30"), default=30.0, help="seconds a forwarded call may take"
    )
    g.add_argument("--https-cert", default=None, help="serve https:// with this certificate (PEM)")
    g.add_argument("--https-key", default=None, help="... and this key (PEM)")
    g.add_argument("--no-advertise-iac", action="store_true", help="publish only the JSON-RPC interfaces")
    g.add_argument(
        "--max-calls",
        metavar="N",
        type=integer(minimum=1, maximum=1024, what="count"),
        default=48,
        help="calls and streams toward the agent at once (default 48: below a peer's 64 in flight)",
    )
    g.add_argument(
        "--max-calls-per-principal",
        metavar="N",
        type=integer(minimum=1, maximum=1024, what="count"),
        default=16,
        help="... of them for one principal (default 16); more wait at most 5 s, then HTTP 429",
    )
    g.add_argument(
        "--max-connections",
        metavar="N",
        type=integer(minimum=1, maximum=1 << 20, what="count"),
        default=1024,
        help="HTTP connections at once (default 1024, lowered to fit the descriptor limit)",
    )
    g.add_argument(
        "--max-connections-per-address",
        metavar="N",
        type=integer(minimum=1, maximum=1 << 20, what="count"),
        default=64,
        help="HTTP connections at once from one client address (default 64)",
    )
    add_transport_options(g)
    add_server_options(g)
    g.set_defaults(func=_run(run_gateway))

    b = verbs.add_parser("bridge", help="answer A2A over IAC for an HTTP A2A agent")
    b.add_argument("--key", required=True, help="the bridge node's key file")
    add_listen_option(b)
    b.add_argument("--to", required=True, metavar="URL", help="the HTTP A2A agent's base URL")
    b.add_argument("--bearer-token-file", default=None, help="a token for the HTTP leg")
    b.add_argument(
        "--trust-gateway",
        action="append",
        default=[],
        metavar="AGENT",
        help="believe this gateway's principal",
    )
    b.add_argument(
        "--timeout", type=seconds(example="30"), default=30.0, help="seconds an HTTP call may take"
    )
    add_transport_options(b)
    add_server_options(b, admin=False, metrics=False)
    b.set_defaults(func=_run(run_bridge))

    c = verbs.add_parser("card", help="print an IAC agent's A2A card")
    c.add_argument("--key", required=True, help="a key file to dial with")
    c.add_argument("--to", required=True, metavar="AGENT", help="the IAC agent's AgentId")
    c.add_argument("--addr", action="append", default=[], metavar="URL", help="an address of the agent")
    c.add_argument("--timeout", type=seconds(example="10"), default=10.0, help="seconds to wait for the card")
    add_transport_options(c)
    c.set_defaults(func=_run(run_card))
