"""The stores layer: where replay windows and registry rows are kept.

In memory, in a SQLite file (survives a restart, shared by the processes of a
host) or in Redis (shared by hosts). Each store implements an interface that
:mod:`iac.protocol` defines; nothing here knows about transports or the node.
"""
