"""`minilmd bench ...`: the benchmarks (prepare, append, packing, step, sft, checkpoint), each printed side by side
in one run. Each imports its implementation under `minilmd.trainer.bench` inside its body; those that may compile
(packing, sft: train.compile; step) in a private compile cache of their own (minilmd/compile_cache.py).
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import typer

from minilmd.corpus.exits import interruptible

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks, printed side by side in one run.")


@contextlib.contextmanager
def private_compile_caches(what: str) -> Iterator[None]:
    """The torch.compile caches of a bench that may compile (packing, step, sft): a fresh private directory, removed
    after, unless the user set them to a directory of his own alone (minilmd/compile_cache.py); set before the bench
    imports torch. A value set that is not used is said."""
    from minilmd.compile_cache import private_caches, refusals

    with private_caches(what) as chosen:
        for line in refusals(chosen):
            print(f"{what}: {line}", file=sys.stderr)
        yield


def interrupt_said(what: str):
    """Ctrl-C, SIGTERM or SIGHUP end a bench as they end the other commands (minilmd/corpus/exits.py
    `interruptible`): exit 130 and one line saying so. The bench's temporary directories are removed as the
    interrupt unwinds through them, before the line."""
    return interruptible(f"{what}: interrupted, no figures; its temporary files removed")


@bench_app.command("prepare")
def bench_prepare_command(
    corpus: list[str] = typer.Argument(..., help="JSONL files to prepare (a few hundred MB for a fair figure)."),
    tokenizer: str = typer.Option(..., "--tokenizer", help="The tokenizer (a tokenizer.json)."),
    workers: int = typer.Option(-1, "--workers", help="prepare's encoding processes; -1: one per core."),
    scratch: str = typer.Option(None, "--scratch", help="Where the prepared output goes (deleted after)."),
    data_format: str = typer.Option("text", "--format", help="text, or chat: prepare --format chat beside its floor "
                                                            "(one rendering + encode_batch)."),
    seq_len: int = typer.Option(512, "--seq-len", help="chat: prepare's --seq-len (the cut)."),
) -> None:
    """prepare throughput (MB/s, tokens/s) beside the tokenizer's raw encode_batch on the same data and cores,
    and prepare's peak RSS. Goal: >= 0.9x raw, < 1 GiB. --format chat: MB and tokens per CPU second of prepare
    --format chat beside its floor. Goal: >= 0.9x."""
    from minilmd.corpus.bench.prepare import bench_prepare

    if data_format not in ("text", "chat"):
        raise typer.BadParameter("text or chat", param_hint="--format")
    with interrupt_said("bench prepare"):
        bench_prepare(corpus, tokenizer, workers=None if workers < 0 else workers, scratch=scratch,
                      data_format=data_format, seq_len=seq_len)


@bench_app.command("append")
def bench_append_command(
    tokenizer: str = typer.Option(..., "--tokenizer", help="The tokenizer (a tokenizer.json)."),
    old: str = typer.Option(None, "--old", help="The corpus to grow (JSONL); default: generated, --size-mb."),
    new: str = typer.Option(None, "--new", help="The lines to append (JSONL); default: generated, --new-lines."),
    size_mb: float = typer.Option(1024, "--size-mb", help="Size of the generated OLD corpus."),
    new_lines: int = typer.Option(10_000, "--new-lines", help="Lines of the generated NEW corpus."),
    workers: int = typer.Option(-1, "--workers", help="prepare's encoding processes; -1: one per core."),
    scratch: str = typer.Option(None, "--scratch", help="Where the corpora go (deleted after)."),
) -> None:
    """prepare --append NEW against a full prepare of OLD+NEW: time, CPU, peak disk, side by side in one run,
    and whether the two results are byte-identical."""
    from minilmd.corpus.bench.append import bench_append

    with interrupt_said("bench append"):
        bench_append(tokenizer, old, new, size_mb, new_lines, None if workers < 0 else workers, scratch)


@bench_app.command("packing")
def bench_packing_command(
    prepared: str = typer.Option(..., "--prepared", help="A prepared corpus directory."),
    config: str = typer.Option(..., "--config", help="A run config: model, seq_len, batch, device."),
    steps: int = typer.Option(20, "--steps", help="Optimizer steps timed in each mode."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: SECTION.KEY=VALUE (repeatable)."),
) -> None:
    """Same model, same steps, packed (unmasked and data.doc_mask) vs padded rows: real tokens/s of each, the ratios,
    the PAD share."""
    with interrupt_said("bench packing"), private_compile_caches("minilmd bench packing"):
        from minilmd.trainer.bench.packing import main as bench_main

        status = bench_main(prepared, config, steps, set_)
    raise typer.Exit(status)


@bench_app.command("step")
def bench_step_command(
    config: str = typer.Option("", "--config", help="A run config: its model, seq_len, batch, dtype, device "
                                                    "(default: a small MiniMind-3-shaped model)."),
    steps: int = typer.Option(10, "--steps", help="Optimizer steps timed in each mode."),
    backend: str = typer.Option("inductor", "--backend", help="torch.compile backend (eager: trace only)."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: SECTION.KEY=VALUE (repeatable)."),
    modes: str = typer.Option("", "--modes", help="Comma-separated modes to run (default: all six: eager, "
                              "compiled, eager-outside, compiled-outside, eager-masked, compiled-masked)."),
) -> None:
    """One model, eager vs torch.compile, steps interleaved: tok/s and host time per step of each, the ratio."""
    with interrupt_said("bench step"), private_compile_caches("minilmd bench step"):
        from minilmd.trainer.bench.step import main as bench_main

        status = bench_main(config or None, steps, set_, backend, modes)
    raise typer.Exit(status)


@bench_app.command("sft")
def bench_sft_command(
    prepared: str = typer.Option(..., "--prepared", help="A prepared (chat) corpus directory."),
    config: str = typer.Option(..., "--config", help="A run config: model, seq_len, batch, device."),
    steps: int = typer.Option(10, "--steps", help="Optimizer steps timed in each mode."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: SECTION.KEY=VALUE (repeatable)."),
) -> None:
    """Same model, same steps: static padding vs length bucketing (and packed, and padding-free): real and target
    tokens/s, PAD share, the ratio bucketed/static and its limit."""
    with interrupt_said("bench sft"), private_compile_caches("minilmd bench sft"):
        from minilmd.trainer.bench.sft import main as bench_main

        status = bench_main(prepared, config, steps, set_)
    raise typer.Exit(status)

@bench_app.command("checkpoint")
def bench_checkpoint_command(
    out_dir: str = typer.Option(None, "--dir", help="A directory where the bench makes a new one of its own to write "
                                "into, removed after (nothing else is touched); default: /dev/shm, else the system's "
                                "temporary directory."),
    hidden: int = typer.Option(768, "--hidden", help="model.hidden_size"),
    layers: int = typer.Option(8, "--layers", help="model.num_hidden_layers"),
    repeats: int = typer.Option(5, "--repeats", min=1, help="Saves timed per method (the median is reported)."),
) -> None:
    """Time a checkpoint save of a real model + AdamW state: blocking time of the async saver, a synchronous save,
    and a plain torch.save of the same state; sizes on disk."""
    if out_dir is not None and not os.path.isdir(out_dir):
        raise typer.BadParameter(f"{out_dir} is no directory (the bench makes a new one of its own in it)",
                                 param_hint="--dir")
    with interrupt_said("bench checkpoint"):
        from minilmd.trainer.bench.checkpoint import main as bench_main

        status = bench_main(out_dir, hidden, layers, repeats)
    raise typer.Exit(status)
