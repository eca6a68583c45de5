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

# === checkpoints: verify, bench checkpoint ===
@app.command("verify")
def verify_command(
    path: str = typer.Argument(..., help="A step-XXXXXXXX checkpoint directory, or a root holding several."),
    json_: bool = typer.Option(False, "--json", help="Print a JSON report (for scripts)."),
    config: str = typer.Option("", "--config", help="A run config: also check its model config and corpus "
                                                    "fingerprints."),
) -> None:
    """Validate checkpoints strictly (manifest, sizes, sha256, shapes, finiteness, steps); nothing is moved.

    Exit status: 0 every checkpoint is valid, 1 otherwise (the reasons are printed), 2 a bad --config."""
    import json

    from minilmd.trainer.checkpoint import expectation_from_config, verify_report
    from minilmd.trainer.config import ConfigError

    try:
        expected = expectation_from_config(config, log=lambda s: typer.echo(s, err=True)) if config else None
    except ConfigError as e:
        typer.echo(f"minilmd verify: {e}", err=True)
        raise typer.Exit(2)
    report = verify_report(path, expected)
    if json_:
        typer.echo(json.dumps(report, indent=2))
    else:
        for entry in report["checkpoints"]:
            typer.echo(f"{entry['path']}: {'ok' if entry['ok'] else 'INVALID'}")
            for problem in entry["problems"]:
                typer.echo(f"  - {problem}")
    raise typer.Exit(0 if report["ok"] else 1)


@bench_app.command("checkpoint")
def bench_checkpoint_command(
    out_dir: str = typer.Option("/dev/shm/minilmd-bench-checkpoint", "--dir", help="Where to write (removed after)."),
    hidden: int = typer.Option(768, "--hidden", help="model.hidden_size"),
    layers: int = typer.Option(8, "--layers", help="model.num_hidden_layers"),
    repeats: int = typer.Option(5, "--repeats", min=1, help="Saves timed per method (the median is reported)."),
) -> None:
    """Time a checkpoint save of a real model + AdamW state: blocking time of the async saver, a synchronous save,
    and a plain torch.save of the same state; sizes on disk."""
    from minilmd.trainer.checkpoint_bench import main as bench_main

    raise typer.Exit(bench_main(out_dir, hidden, layers, repeats))
# === end checkpoints ===

# === weights: sample, export ===
# === end weights ===

# === supervisor: run, status, logs, stop ===
# === end supervisor ===


def main() -> None:
    app()


if __name__ == "__main__":
    main()
