#!/usr/bin/env bash
# Build the bench venv (ruff, TorchFix, Fixit, cfgfix from this checkout) and the corpus,
# without timing anything. Same options as run.py (e.g. --bench-dir, --corpus, --venv).
set -euo pipefail
exec python3 "$(dirname "$0")/run.py" --setup-only "$@"
