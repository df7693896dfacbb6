"""Scale probes, kept under their old name: the code is ``iac/bench/scenarios/scale.py``.

.venv/bin/python -m tools.scale_probe memory --transport tls --peers 1000 [--procs 4]
.venv/bin/python -m tools.scale_probe burst --transport quic --dials 1000 [--procs 4]
.venv/bin/python -m tools.scale_probe bytes [CORPUS.jsonl]
"""

from __future__ import annotations

import sys

from iac.bench.scenarios.scale import (
    Server,
    client_config,
    close_all,
    live_rss,
    main,
    open_peer,
    open_peers,
    probe_burst,
    probe_bytes,
    probe_memory,
    request,
    serve,
    server,
)

__all__ = [
    "Server",
    "client_config",
    "close_all",
    "live_rss",
    "main",
    "open_peer",
    "open_peers",
    "probe_burst",
    "probe_bytes",
    "probe_memory",
    "request",
    "serve",
    "server",
]

if __name__ == "__main__":
    sys.exit(main())
