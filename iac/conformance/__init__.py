"""A conformance tester for IAC: a protocol peer that points at any implementation.

``iac conformance URL --to AGENT_ID`` dials a running node (TLS, UNIX or QUIC) and runs the
cases of :mod:`.cases`: the node's HELLO field by field, PING/REPLY, one-way with ACK, every
refusal docs/PROTOCOL.md names (forged HELLOs, bad signatures, stale and duplicate messages,
impersonation) and the 62 negative test vectors a live connection can carry, each with the
close code or ERROR it must draw, and after each refusal that the node still serves another
connection. ``--client`` turns it round (:mod:`.listen`): the tester listens and judges the
implementation as it dials.

Built from the wire and protocol layers and raw sockets (:mod:`.link`), not from
:mod:`iac.transport`, which only sends well-formed frames; it uses no test hook of ``iac``.
"""

from iac.conformance import quic_cases  # noqa: F401 (registers the QUIC cases)
from iac.conformance.runner import DEFAULT_TIMEOUT, CaseResult, Report, run_server_suite
from iac.conformance.target import CASES, Case, Outcome, Target
from iac.conformance.vector_cases import all_cases

__all__ = [
    "CASES",
    "DEFAULT_TIMEOUT",
    "Case",
    "CaseResult",
    "Outcome",
    "Report",
    "Target",
    "all_cases",
    "run_server_suite",
]
