"""``iac conformance``: the conformance tester (docs/IMPLEMENTING.md, "The conformance tester").

``iac conformance URL --to AGENT_ID`` dials the implementation at ``URL`` (``tls://``,
``unix://``, ``quic://``) and runs every case; ``iac conformance --client URL`` listens at
``URL``, prints ``tester AGENT_ID`` and ``listening URL``, and judges the implementation as it
dials in (``--connections`` of them). Each case prints PASS or FAIL with what was expected and
seen, the run ends with a summary (``--json``: one JSON document). Exit 0 when every case
passed, 1 when one failed, 2 on a usage error or when nothing IAC ever answered.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from iac.cli.options import integer, print_error, seconds
from iac.conformance import DEFAULT_TIMEOUT, CaseResult, Report, all_cases, run_server_suite
from iac.conformance.listen import DEFAULT_WAIT, run_client_suite
from iac.errors import ConfigError, MessageRejected
from iac.transport.base import parse_address
from iac.wire.identity import Identity, check_agent_id


def _printer(args: argparse.Namespace) -> Callable[[CaseResult], None] | None:
    if args.json:
        return None

    def show(result: CaseResult) -> None:
        print(result.line(), flush=True)

    return show


def _finish(args: argparse.Namespace, report: Report) -> int:
    if args.json:
        print(report.to_json())
    else:
        print(report.summary())
    return report.exit_status


def _cmd(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (ConfigError, MessageRejected) as exc:  # a usage error: exit 2, as for a bad argument
        if isinstance(exc, MessageRejected) and exc.reason != "invalid_agent_id":
            raise
        print_error("conformance", exc)
        return 2


def _run(args: argparse.Namespace) -> int:
    parse_address(args.url)  # a URL that is not tls://, unix:// or quic:// is a usage error
    vectors = Path(args.vectors) if args.vectors else None
    if args.client:
        identity = Identity.load(args.key) if args.key else Identity.generate()
        report = asyncio.run(
            run_client_suite(
                args.url,
                identity,
                connections=args.connections,
                wait=args.wait,
                timeout=args.timeout,
                announce=lambda line: print(line, flush=True),
                on_result=_printer(args),
                refusals=args.refusals,
            )
        )
        return _finish(args, report)
    if not args.to:
        raise ConfigError("--to AGENT_ID is required unless --client is given (the node's AgentId)")
    check_agent_id(args.to)
    cases = all_cases(vectors)
    if args.case:
        cases = [c for c in cases if any(c.id == p or c.id.startswith(p + ".") for p in args.case)]
        if not cases:
            raise ConfigError(f"--case {' '.join(args.case)}: no case has that id or prefix")
    report = asyncio.run(
        run_server_suite(args.url, args.to, cases, timeout=args.timeout, on_result=_printer(args))
    )
    return _finish(args, report)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``conformance`` to the ``iac`` parser."""
    p = sub.add_parser(
        "conformance",
        help="run the conformance suite against an implementation (it listens, or with --client it dials)",
        description="Exit 0: every case passed; 1: a case failed; 2: usage error, or nothing IAC answered.",
    )
    p.add_argument("url", metavar="URL", help="tls://HOST:PORT, unix:///PATH or quic://HOST:PORT")
    p.add_argument("--to", default=None, metavar="AGENT_ID", help="the implementation's AgentId (dialing)")
    p.add_argument(
        "--client",
        action="store_true",
        help="listen at URL and judge the implementation as it dials in (its client role)",
    )
    p.add_argument(
        "--refusals",
        action="store_true",
        help="--client: answer the first 5 connections with forged HELLOs (bad signature, stale, other "
        "binding, wrong nonce echo, another key) that the implementation must refuse with their close codes",
    )
    p.add_argument("--key", default=None, help="--client: the tester's key file (default: a fresh key)")
    p.add_argument(
        "--connections",
        type=integer(minimum=1, maximum=1000, what="number of connections"),
        default=1,
        help="--client: how many connections to judge before the summary (default %(default)d)",
    )
    p.add_argument(
        "--wait",
        type=seconds(example="30"),
        default=DEFAULT_WAIT,
        help="--client: seconds to wait for each connection (default %(default)g)",
    )
    p.add_argument(
        "--timeout",
        type=seconds(example="5"),
        default=DEFAULT_TIMEOUT,
        help="seconds each case may take, all its steps together; past it the case fails with "
        "'no answer in N s' and the run goes on (default %(default)g)",
    )
    p.add_argument(
        "--case", action="append", metavar="ID", help="run only this case id or id prefix (repeatable)"
    )
    p.add_argument(
        "--vectors",
        default=None,
        metavar="FILE",
        help="the v1.json test vectors (default: proto/testvectors/v1.json of this checkout)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of lines")
    p.set_defaults(func=_cmd)


__all__ = ["register"]
