"""What several stores share: the replay stores' argument checks, and how record stores write
an :class:`~iac.protocol.record_store.AgentRow`'s lists."""

from __future__ import annotations

import json
from collections.abc import Iterable

from iac.errors import ConfigError, StoreUnavailable
from iac.protocol.replay import DEFAULT_RESERVATION_LEASE_US, ReplayConfig

_MASK64 = (1 << 64) - 1

#: Largest ``window_size`` the SQLite and Redis replay stores accept (the bitmap is read and
#: written on every call).
MAX_STORE_WINDOW_SIZE = 1 << 16
#: Longest sender string accepted (an AgentId is 64 characters).
MAX_SENDER_LEN = 256


def check_u64(name: str, value: int) -> None:
    if not 0 <= value <= _MASK64:
        raise ConfigError(f"{name} must be an unsigned 64-bit integer, got {value}")


def check_args(sender: str, session_id: int, msg_id: int) -> None:
    check_u64("msg_id", msg_id)
    check_u64("session_id", session_id)
    if not isinstance(sender, str) or not 0 < len(sender) <= MAX_SENDER_LEN:
        raise ConfigError(f"sender must be a non-empty string of at most {MAX_SENDER_LEN} characters")


def check_via(via: str | None) -> None:
    if via is not None and (not isinstance(via, str) or not 0 < len(via) <= MAX_SENDER_LEN):
        raise ConfigError(f"via must be a non-empty string of at most {MAX_SENDER_LEN} characters")


def check_store_config(config: ReplayConfig, reservation_lease_us: int | None) -> int:
    """Check a config for a store with history; return the reservation lease."""
    if config.window_size > MAX_STORE_WINDOW_SIZE:
        raise ConfigError(
            f"window_size {config.window_size} is above {MAX_STORE_WINDOW_SIZE}, the most a store keeps"
        )
    lease = DEFAULT_RESERVATION_LEASE_US if reservation_lease_us is None else reservation_lease_us
    if lease <= 0:
        raise ConfigError(f"reservation_lease_us must be positive, got {lease}")
    return lease


def share_refusal(sender: str, via: str, held_sender: int, held_via: int, cap: int) -> str:
    """The text of a new session refused for its tenant's share (``ReplayConfig.tenant_sessions``)."""
    if held_sender >= cap:
        who = f"sender {sender[:16]}… holds {held_sender} sessions"
    else:
        who = f"neighbour {via[:16]}… brought in {held_via} sessions"
    return f"replay store: {who}, its share (sessions_per_tenant {cap}); refused until one expires"


def json_list(values: Iterable[str]) -> str:
    return json.dumps(list(values), separators=(",", ":"))


def str_tuple(text: str | bytes) -> tuple[str, ...]:
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise StoreUnavailable("registry store holds a malformed row")
    return tuple(value)
