"""Coverage-guided fuzzing of the parsers a hostile peer reaches (atheris).

* :mod:`tests.fuzz.targets`: one ``TestOneInput(data)`` per target (frames, message, hello,
  forward, records, files, dict), importable without atheris running;
* :mod:`tests.fuzz.bounds`: what every input is held to (only the peer's typed errors escape,
  memory and time per input) and the checked call that enforces it;
* :mod:`tests.fuzz.run`: one target under atheris (``python -m tests.fuzz.run frames -runs=1000``);
* ``python -m tests.fuzz``: every target (or some) for a while each (``make fuzz``);
* ``python -m tests.fuzz.seeds``: rewrite the seed files of ``tests/fuzz/corpus/`` from the
  test vectors in ``proto/testvectors/``.

The committed corpus (``tests/fuzz/corpus/<target>/``) holds those seeds and every input that
once broke a bound; ``tests/test_fuzz.py`` replays it and runs each target briefly.
"""
