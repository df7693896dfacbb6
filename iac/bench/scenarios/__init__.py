"""The scenarios: each measures its contenders in turns and fills
a :class:`~iac.bench.harness.results.Result`
(``run(ctx, res)``). They import the harness, the contenders and the reports (to print what they measured)."""
