"""The protocol layer: state machines driven by messages and an explicit time.

Handshake, freshness and the replay window, ordered delivery, routing and
relays, file transfer, registry records and decisions, and the receive-pipeline
checks. Nothing here opens a socket or runs an event loop, and the state
machines take the time as an argument (:mod:`iac.protocol.clock` holds the
injectable clock that the adapters read). It builds on :mod:`iac.wire` and
:mod:`iac.errors`.
"""
