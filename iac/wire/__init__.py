"""The wire layer, sans-IO: bytes to signed messages and back.

Frame codec and the streaming scanner, zstd dictionaries, the signing rule and
its field-8 scan, Ed25519 identities and sealed payloads. Nothing here does I/O
or reads a clock; it imports only :mod:`iac.errors`.
"""
