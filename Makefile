# Two commands for a fresh machine: `make demo` and `make test`. Each is self-contained:
# it creates .venv with the project's own files and nothing else.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO ?= $(sort $(wildcard fixtures/*/project))

.PHONY: demo test rules bench clean release-tag

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

# The release's tag, which the README's pre-commit snippet pins (docs/releasing.md): refused
# unless the tree is committed and the README's `rev:` names this version.
VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' cfgfix/__init__.py)
release-tag:
	@test -n "$(VERSION)" || { echo "no __version__ in cfgfix/__init__.py"; exit 1; }
	@git diff --quiet HEAD -- || { echo "uncommitted changes: commit the release first"; exit 1; }
	@grep -qx '    rev: v$(VERSION)' README.md || { echo "README.md's pre-commit snippet does not pin rev: v$(VERSION)"; exit 1; }
	git tag -a v$(VERSION) -m "cfgfix $(VERSION)"
	@echo "tagged v$(VERSION); publish it with: git push origin v$(VERSION)"

clean:
	rm -rf $(VENV) .cfgfix_cache .pytest_cache build *.egg-info
