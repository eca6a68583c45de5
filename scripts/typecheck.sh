#!/usr/bin/env bash
# mypy over the three source folders as the one package `minilmd`: `scripts/typecheck.sh [PYTHON]`.
# mypy finds modules by folder and cannot follow the package-dir mapping of pyproject.toml (minilmd.daemon ->
# daemon/, minilmd.trainer -> trainer/), so this lays that mapping out as links under build/typecheck/ and reports
# the errors with the real paths.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${1:-$root/.venv/bin/python}"
tree="$root/build/typecheck"
rm -rf "$tree"
mkdir -p "$tree/minilmd"
ln -s "$root"/minilmd/*.py "$tree/minilmd/"
for init in "$root"/minilmd/*/__init__.py; do  # every subpackage (corpus/, cli/, ...)
  ln -s "$(dirname "$init")" "$tree/minilmd/"
done
ln -s "$root/daemon" "$tree/minilmd/daemon"
ln -s "$root/trainer" "$tree/minilmd/trainer"
cd "$root"
MYPYPATH="$tree" "$py" -m mypy -p minilmd 2>&1 |
  sed -e 's|^build/typecheck/minilmd/daemon/|daemon/|' -e 's|^build/typecheck/minilmd/trainer/|trainer/|' \
      -e 's|^build/typecheck/minilmd/|minilmd/|'
