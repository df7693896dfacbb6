"""QUIC transport."""
