"""The `minilmd` command line.

Each command imports its implementation inside its body, so that `minilmd status` never pays for torch. Commands
are grouped by the part of minilmd they belong to; each group lives between its own markers below.
"""
from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="minilmd: resilient training of small LMs.")
tokenizer_app = typer.Typer(no_args_is_help=True, help="Train or inspect a tokenizer.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks, printed side by side in one run.")
app.add_typer(tokenizer_app, name="tokenizer")
app.add_typer(bench_app, name="bench")


# === data: tokenizer, prepare, bench prepare ===
# === end data ===

# === trainer: train, bench packing ===
# === end trainer ===

# === checkpoints: verify ===
# === end checkpoints ===

# === weights: sample, export ===
# === end weights ===

# === supervisor: run, status, logs, stop ===
# === end supervisor ===


def main() -> None:
    app()


if __name__ == "__main__":
    main()
