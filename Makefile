# `make demo` and `make test` each do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned, so no other requirement can pull a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/spotlight demo --config configs/digits.yaml

# One test process: with two (pytest-xdist, -n 2 --dist loadfile: 25 min instead of 39) the load
# brought out timing races in the preemption tests' own choreography in 2 of 2 runs.
test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=20

clean:
	rm -rf $(VENV) runs reports
