# Two commands on a fresh machine with Python 3.11+ and make:
#   make demo   create .venv, install, run the demo on loopback
#   make test   create .venv, install dev extras (and, when missing, the Debian packages and npm
#               packages the tests use: tools/test-deps.sh), run ruff, mypy and the whole test suite
#               (the fuzz targets in their short form included: tests/test_fuzz.py)
#   make fuzz   every fuzz target under atheris for FUZZ_SECONDS (60) each; TARGET=frames for one
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test docs fuzz proto dict vectors bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/python -m iac demo

test: $(VENV)/.installed-dev
	bash tools/test-deps.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m iac bench --smoke --out .bench-smoke
	$(BIN)/pytest -q

# The API reference and the guides as a site in build/site (mkdocs.yml; `make test` builds it too,
# with warnings as errors, in tests/test_reference.py).
docs: $(VENV)/.installed-dev
	$(BIN)/mkdocs build --strict

# Coverage-guided fuzzing of the parsers a hostile peer reaches (tests/fuzz/): each target for
# FUZZ_SECONDS seconds, or only TARGET (frames, message, hello, forward, records, files, dict).
# Found inputs go to build/fuzz/, an input that breaks a bound to build/fuzz/crashes/.
FUZZ_SECONDS ?= 60
fuzz: $(VENV)/.installed-dev
	$(BIN)/python -m tests.fuzz --seconds $(FUZZ_SECONDS) $(TARGET)

# Regenerate iac/wire/_pb from proto/iac.proto (grpcio-tools is pinned in the dev extras,
# so the output is byte-identical to what is committed).
proto: $(VENV)/.installed-dev
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=iac/wire/_pb --pyi_out=iac/wire/_pb proto/iac.proto

# Rewrite the files in proto/testvectors/ (deterministic; existing zstd frames in v1.json are kept
# while they decode).
vectors: $(VENV)/.installed-dev
	$(BIN)/python -m tools.make_testvectors
	$(BIN)/python -m tools.make_payload_vectors
	$(BIN)/python -m tools.vectors.records
	$(BIN)/python -m tools.vectors.mesh
	$(BIN)/python -m tools.vectors.elide
	$(BIN)/python -m tools.vectors.elide_forward
	$(BIN)/python -m tools.vectors.dictionaries

# Retrain the shipped dictionary on the training split of the corpus.
dict: $(VENV)/.installed-dev
	$(BIN)/python tools/train_default_dict.py

# The whole benchmark suite (report, JSON and plots in bench-results/); see benchmarks/README.md.
bench: $(VENV)/.installed-dev
	$(BIN)/python -m iac bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
