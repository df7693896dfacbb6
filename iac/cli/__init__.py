"""The ``iac`` command line (:func:`iac.cli.main.main`): one module per verb group.

:mod:`~iac.cli.main` builds the parser from each module's ``register`` and runs the verb;
:mod:`~iac.cli.options` holds what the verbs share (the one-line parser, checked argument types,
``--listen``, the transport and CA options, serving until a signal, JSON arguments, the one error
line); :mod:`~iac.cli.checks` the checks of keys, AgentIds, addresses and paths;
:mod:`~iac.cli.logs` logging (``-v``, ``--log-format``); :mod:`~iac.cli.serving` what a node that
runs until interrupted adds (status socket, metrics); :mod:`~iac.cli.status` ``iac status``.
"""
