# Two commands for a fresh machine: `make demo` and `make test`. Each is self-contained:
# it creates .venv with the project's own files and nothing else.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO ?= $(sort $(wildcard fixtures/*/project))

.PHONY: demo test rules bench clean

$(BIN)/cfgfix: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --quiet -e .
	@touch $@

# The tests also run real (tiny) training steps, so the dev environment gets the `verify`
# extra. TORCH pins the build: torch==2.13.0 is the CPU wheel on this project's machines;
# an unpinned torch may download a multi-GB CUDA build. If it cannot be installed, the
# tests that need torch are skipped and the rest still run.
TORCH ?= torch==2.13.0
$(VENV)/.dev: $(BIN)/cfgfix
	$(BIN)/python -m pip install --quiet --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --quiet '$(TORCH)' && $(BIN)/python -m pip install --quiet --quiet -e '.[verify]' \
		|| echo "note: torch/transformers not installed; the tests that need them will be skipped"
	@touch $@

# cfgfix's main job on the bundled sample projects: the findings, then the diff `fix` would make.
demo: $(BIN)/cfgfix
	@echo "== cfgfix check $(DEMO)"
	@$(BIN)/cfgfix check --no-cache $(DEMO); test $$? -le 1  # 1 = findings: expected here
	@echo
	@echo "== cfgfix fix --diff --unsafe-fixes $(DEMO)   (writes nothing)"
	@$(BIN)/cfgfix fix --diff --unsafe-fixes --no-cache $(DEMO); test $$? -le 1
	@echo
	@echo "== in fixtures/flan-t5-xl-trainer/project (its cfgfix.toml targets an RTX 5090): cfgfix fix --fit --diff   (writes nothing)"
	@cd fixtures/flan-t5-xl-trainer/project && $(abspath $(BIN))/cfgfix fix --fit --diff; test $$? -le 1

test: $(VENV)/.dev
	$(BIN)/python -m pytest -q

# Regenerate the rule reference in rules/ from the rule classes.
rules: $(BIN)/cfgfix
	$(BIN)/python -m cfgfix.rulepages

bench: $(BIN)/cfgfix
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .cfgfix_cache .pytest_cache build *.egg-info
