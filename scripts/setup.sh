#!/usr/bin/env bash
# Prepare a Python environment for minilmd: the active virtualenv if there is one, else ./.venv. The argument is the
# extra to install with it: test (the default: pytest, ruff, mypy and what the tests import) or demo (make demo).
# Prints the path of the environment's python on its last line. Safe to run again: it reinstalls only when
# pyproject.toml changed, or when the environment's `minilmd` is another checkout's.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
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
if [ -n "${VIRTUAL_ENV:-}" ]; then where="the active virtualenv $venv"; else where="$venv"; fi
# The stamp records the requirements (pyproject's hash) and the checkout installed: an active virtualenv made for
# another checkout of minilmd holds that one's editable install, which the trainer (`python -P -m minilmd.cli`)
# would import instead of this one (user10 #1).
stamp="$venv/.minilmd-setup-$extras"
want="$(sha256sum "$root/pyproject.toml" | cut -c1-16)"
had="$(cat "$stamp" 2>/dev/null || true)"
installed="$("$py" -P -c 'import minilmd, os; print(os.path.dirname(os.path.realpath(minilmd.__file__)))' \
  2>/dev/null || true)"
if [ "${had%% *}" = "$want" ] && [ "$installed" = "$root/minilmd" ]; then
  [ "$had" = "$want $root" ] || echo "$want $root" > "$stamp"
elif [ "${had%% *}" = "$want" ]; then
  # The same requirements, installed for another checkout (or by an older setup.sh): only the package moves here.
  echo "setup: $where imports minilmd from ${installed:-nowhere}; installing this checkout ($root) instead" >&2
  "$py" -m pip install -q --no-deps -e "$root" >&2
  echo "$want $root" > "$stamp"
else
  echo "setup: installing minilmd[$extras] and its requirements into $where" >&2
  "$py" -m pip install -q --upgrade pip >&2
  # torch pinned first: the machine's local CPU wheel where pip's find-links provide one (PyPI's is a CUDA build of
  # several GB: README, PIP_EXTRA_INDEX_URL). A range in pyproject that 2.13.0 satisfies then installs nothing more.
  if ! "$py" -c 'import torch' 2>/dev/null; then
    "$py" -m pip install -q "torch==2.13.0" >&2
  fi
  "$py" -m pip install -q -e "$root[$extras]" >&2
  echo "$want $root" > "$stamp"
fi
echo "$py"
