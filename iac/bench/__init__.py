"""The IAC benchmark suite, shipped with the library: ``iac bench`` or ``python -m iac.bench``.

Layers are folders, imports only downward: :mod:`~iac.bench.harness` (turns, results schema,
statistics, environment, record) <- :mod:`~iac.bench.contenders` (baselines, floors, IAC nodes)
and :mod:`~iac.bench.reports` (results files to Markdown and plots) <- :mod:`~iac.bench.scenarios`
(each ``run(ctx, res)``) <- :mod:`iac.bench.main` (the runner). Its extra dependencies come with
``pip install 'iac[bench]'``.
"""
