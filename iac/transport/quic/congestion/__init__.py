"""Congestion control for the QUIC adapter: which algorithm a connection runs, and BBR.

``TransportConfig.congestion`` names the algorithm: ``"reno"`` (the default, aioquic's
own), ``"cubic"`` (aioquic's) or ``"bbr"`` (this package). :func:`library_algorithm`
turns it into the name the QUIC library's configuration takes, registering BBR with
aioquic first; :func:`attach` gives a connection running BBR the hooks it needs
(called by the asyncio protocol, :mod:`iac.transport.quic.protocol`).

* :mod:`.bbr`: BBR's model and state machine (sans-IO: time is an argument);
* :mod:`.rate`: delivery-rate samples and the windowed filters;
* :mod:`.pacer`: the token-bucket pacer;
* :mod:`.adapter`: BBR registered with aioquic, and the hooks (imported only when used,
  like every library-specific part of the adapter).

BBR needs Python-level access to the QUIC library's packet recovery, so it runs on aioquic
only; a backend without it (qh3, whose recovery is compiled) refuses it with
:class:`~iac.errors.ConfigError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from iac.errors import ConfigError
from iac.transport.base import CONGESTION_CONTROLS, DEFAULT_CONGESTION

if TYPE_CHECKING:
    from iac.transport.quic.backend import Backend

#: The algorithm a ``TransportConfig`` runs unless told otherwise (aioquic's default).
DEFAULT = DEFAULT_CONGESTION
#: Backends whose congestion control can be replaced from Python.
HOOKABLE_BACKENDS = ("aioquic",)


class TransmitHooks(Protocol):
    """What the asyncio protocol calls on a connection's congestion controller."""

    def before_transmit(self, now: float) -> None:
        """Right before the library builds the datagrams to send."""

    def after_transmit(self, now: float) -> None:
        """Right after the library built and handed out the datagrams to send."""


def library_algorithm(name: str, backend: Backend) -> str:
    """The congestion-control name for ``backend``'s configuration; :class:`ConfigError`
    when ``name`` is unknown or the backend cannot run it."""
    if name not in CONGESTION_CONTROLS:
        raise ConfigError(
            f"unknown congestion control {name!r} (choose one of {', '.join(CONGESTION_CONTROLS)})"
        )
    if name == "bbr":
        if backend.name not in HOOKABLE_BACKENDS:
            raise ConfigError(
                f"congestion control 'bbr' needs a QUIC backend with Python congestion-control hooks "
                f"({', '.join(HOOKABLE_BACKENDS)}); backend {backend.name!r} has none: choose "
                f"'cubic' or 'reno', or the aioquic backend"
            )
        from iac.transport.quic.congestion.adapter import register

        register()
    return name


def configure(configuration: Any, name: str, backend: Backend) -> None:
    """Set the congestion control of a library ``QuicConfiguration``."""
    algorithm = library_algorithm(name, backend)
    if hasattr(configuration, "congestion_control_algorithm"):
        configuration.congestion_control_algorithm = algorithm
    elif algorithm != DEFAULT:
        raise ConfigError(f"QUIC backend {backend.name!r} does not let congestion control be chosen")


def attach(quic: Any, backend: Backend) -> TransmitHooks | None:
    """The hooks for ``quic`` (a library connection) when its controller needs them."""
    if backend.name not in HOOKABLE_BACKENDS:
        return None
    from iac.transport.quic.congestion.adapter import attach as attach_aioquic

    return attach_aioquic(quic)


__all__ = ["DEFAULT", "HOOKABLE_BACKENDS", "TransmitHooks", "attach", "configure", "library_algorithm"]
