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

# One test process: with two (pytest-xdist, -n 2 --dist loadfile) the whole suite took 35 min
# against about 40 serial, and the SP chaos test slowed to 14 of its 15 allowed minutes.
test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=20

clean:
	rm -rf $(VENV) runs reports
