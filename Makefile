# Two commands for a fresh machine (see README.md):
#   make demo   set up .venv (runtime only), compile examples/kda.toml to out/, verify it quickly
#   make test   set up .venv with the test tools, run the IR tests (lit + filecheck) and the suite (pytest,
#               two workers: one per core of a CI machine)
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# --no-compile: no .pyc for torch's thousands of files at install (the demo's two commands compile
# what they import; `make test` compiles it all, below); -q: pip's own progress is noise here
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check --no-compile

.PHONY: setup demo test clean

setup: $(VENV)/.installed

# torch pinned to the CPU build that lies on disk here, in the same resolver pass as the project,
# so that resolving the project's torch range never pulls a multi-GB CUDA build onto a CPU machine.
$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0 -e .
	touch $@

# the test tools on top (pytest, pytest-xdist, lit, filecheck: the project's `test` extra), then
# the bytecode of every installed module: where PYTHONDONTWRITEBYTECODE is set (CI sets it) Python
# never writes it, and each process the tests start (gloo ranks, k3c runs, subprocesses) would
# compile torch from source again: 3.4 s an import instead of 1.7 (15 s here, once).
# py312_intrinsics is Python 3.12-only syntax.
$(VENV)/.installed: $(VENV)/.runtime
	$(PIP) torch==2.13.0 -e '.[test]'
	$(BIN)/python -m compileall -q -j 0 -x py312_intrinsics \
		"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" k3compile ir passes backends > /dev/null
	touch $@

# the full grid (every variant and length) is `k3c verify examples/kda.toml`, a few minutes on
# a CPU; the demo's --quick runs one case per entry
demo: $(VENV)/.runtime
	$(BIN)/k3c compile examples/kda.toml -o out --timing
	$(BIN)/k3c verify examples/kda.toml --quick

test: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/lit -sv tests/filecheck
	$(BIN)/pytest -q -n 2 tests

clean:
	rm -rf $(VENV) out tests/filecheck/Output
