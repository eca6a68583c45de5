#!/usr/bin/env bash
# Prepare a Python environment for minilmd: the active virtualenv if there is one, else ./.venv.
# Prints the path of the environment's python on its last line. Safe to run again: it reinstalls only when
# pyproject.toml changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# From "/": `python -m venv`, `python -m pip` and `python -c` put the working directory first on sys.path, and a
# `pip/` or `venv/` another user left where this is started from would run as us (minilmd/pychild.py).
cd /
extras="${1:-test}"
if [ -n "${VIRTUAL_ENV:-}" ]; then
  venv="$VIRTUAL_ENV"
else
  venv="$root/.venv"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >&2
  fi
fi
py="$venv/bin/python"
stamp="$venv/.minilmd-setup-$extras"
want="$(sha256sum "$root/pyproject.toml" | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  "$py" -m pip install -q --upgrade pip >&2
  # torch pinned first: the machine's local CPU wheel where pip's find-links provide one (PyPI's is a CUDA build of
  # several GB: README, PIP_EXTRA_INDEX_URL). A range in pyproject that 2.13.0 satisfies then installs nothing more.
  if ! "$py" -c 'import torch' 2>/dev/null; then
    "$py" -m pip install -q "torch==2.13.0" >&2
  fi
  "$py" -m pip install -q -e "$root[$extras]" >&2
  echo "$want" > "$stamp"
fi
echo "$py"
