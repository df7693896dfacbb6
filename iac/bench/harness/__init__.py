"""The harness: turns and interleaving, the results schema, statistics, the environment probe and
recording into ``benchmarks/results/``. Imports nothing else of the suite."""
