# `make demo` and `make test` each do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install mutation clean

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned, so no other requirement can pull a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/spotlight demo --config configs/digits-demo.yaml

# `ruff check` ([tool.ruff] in pyproject.toml: pycodestyle, pyflakes, import order) takes under
# a second, so `make test` runs it first. `ruff format` holds the modules in FORMATTED to its
# layout; the others join as they are split: at line length 100 the formatter would push 36
# older modules and functions over the size limits tests/test_code_shape.py enforces.
FORMATTED := spotlight/iteration tests/iteration pipelines/run/recording.py \
	pipelines/run/inprocess.py tests/rl/loop.py tests/parallel/in_place_training.py \
	tests/deploy/test_certificates.py spotlight/models/sd35 \
	spotlight/models/diffusers_parts.py spotlight/models/diffusers_policy.py \
	spotlight/config/model.py tests/models/test_sd35.py tests/models/diffusers_checks.py \
	tests/pipelines/test_sd35_run.py
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check $(FORMATTED)

# Lint first, then the tests in two pytest processes at once (tests/lanes.py): much of the
# suite's time is spent waiting -- on leases, heals, a lost scheduler, processes starting. The
# second runs at a lower CPU priority, so the first one's timing-sensitive tests keep their pace.
test: $(STAMP)
	$(MAKE) lint
	$(BIN)/python tests/lanes.py --durations=30

# Mutation testing of the pure modules ([tool.mutmut] in pyproject.toml names them): about
# 25 minutes on 2 cores. Not part of `make test`; the score goes to docs/results.md.
mutation: $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,mutation]'
	rm -rf mutants
	SPOTLIGHT_INVARIANT_SEQUENCES=200 $(BIN)/mutmut run --max-children 2
	$(BIN)/mutmut results --all true | $(BIN)/python tests/mutation_score.py

clean:
	rm -rf $(VENV) runs reports mutants
