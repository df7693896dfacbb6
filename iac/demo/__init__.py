"""``iac demo``: a 5-process agent mesh on loopback (:mod:`~iac.demo.driver`, each process
:mod:`~iac.demo.agent`), and the one-process codec demo (:mod:`~iac.demo.codec`)."""
