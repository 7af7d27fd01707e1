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

# Two test processes, each taking whole files (module fixtures are made once): most tests wait
# on worker processes and sockets, not on the CPU, so two share the two cores (25 min against
# 39 serial). The preemption tests find their victim under the pool's lock and wait for
# replacements as long as a loaded machine needs.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=20

clean:
	rm -rf $(VENV) runs reports
