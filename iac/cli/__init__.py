"""The ``iac`` command line (:func:`iac.cli.main.main`): one module per verb group.

:mod:`~iac.cli.main` builds the parser from each module's ``register`` and runs the verb;
:mod:`~iac.cli.options` holds what the verbs share (``--listen``, the CA options, the transport
config, serving until a signal, JSON arguments, the one error line).
"""
