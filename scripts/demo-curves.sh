#!/usr/bin/env bash
# Regenerates docs/img/demo-curves.png, the picture README.md shows: the demo (`make demo`'s
# `python -m minilmd.daemon.demo`) in a temporary directory, then `minilmd plot` on its run directory, so the
# picture is what today's `plot` draws of today's demo. Takes a few minutes on CPU, like `make demo`; needs the
# demo extra (the corpora and matplotlib; scripts/setup.sh demo makes it) or the python given as $1 with
# minilmd[demo].
# The temporary directory goes at the end (the demo's scratch goes with the run's finish, as every run's does).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${1:-$("$root/scripts/setup.sh" demo | tail -n1)}"
work="$(mktemp -d "${TMPDIR:-/tmp}/minilmd-demo-curves.XXXXXX")"
trap 'rm -rf "$work"' EXIT
"$py" -m minilmd.daemon.demo "$work/demo"
"$py" -m minilmd.cli plot "$work/demo/run" --out "$root/docs/img/demo-curves.png"
echo "wrote $root/docs/img/demo-curves.png"
