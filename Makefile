# Two commands for a fresh machine (see README.md):
#   make demo   set up .venv, compile examples/kda.toml to out/, verify it against the reference
#   make test   set up .venv, run the IR tests (lit + filecheck) and the test suite (pytest)
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: setup demo test clean

setup: $(VENV)/.installed

# torch first, pinned to the CPU build that lies on disk here, so that resolving the project's
# torch range never pulls a multi-GB CUDA build onto a CPU machine.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

demo: setup
	$(BIN)/k3c compile examples/kda.toml -o out --timing
	$(BIN)/k3c verify examples/kda.toml

test: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/lit -q tests/filecheck
	$(BIN)/pytest -q tests

clean:
	rm -rf $(VENV) out tests/filecheck/Output
