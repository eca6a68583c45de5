"""The tokenizer commands: `tokenizer train`, `tokenizer template`, `tokenizer check`.

Torch-free all the way down, as the other corpus commands (minilmd/cli/data.py; tests/test_layers.py checks it).
"""
from __future__ import annotations

import typer

from minilmd.corpus.cli_options import force_option, group_share_option
from minilmd.corpus.exits import (
    COMMAND_FAILED,
    EXIT_CONFIG,
    data_error_exit,
    interruptible,
    io_error_exit,
    out_dir_of,
    out_error_exit,
)
from minilmd.names import TOKENIZER_FILE

tokenizer_app = typer.Typer(no_args_is_help=True, help="Train or inspect a tokenizer.")


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
    force: bool = force_option("an existing --out (and, with --chat-template, the tokenizer_config.json beside it) "
                               "of yours: another user's file or link there is never replaced, --force or not "
                               "(exit 2)"),
    group_share: bool = group_share_option(),
) -> None:
    """Train a byte-level BPE with PAD <|endoftext|>=0, BOS <|im_start|>=1, EOS <|im_end|>=2 (as MiniMind).

    Exit status: 0, 65 bad input (every bad line named, as prepare names them; or no document at all), 2 bad
    arguments (a source not there, a directory or FIFO, or a file you may not read; a --chat-template that does not
    load or render; an --out, or the
    tokenizer_config.json beside it, already there without --force, or another user's with it), 74 a read or write
    failed, 130 interrupted
    (Ctrl-C, SIGTERM: at once, nothing written)."""
    import sys
    from pathlib import Path

    from minilmd.corpus.chat_templates import OUT_ADVICE, ChatTemplateError, checked_config, write_beside
    from minilmd.corpus.sources.bad_tally import InputError
    from minilmd.corpus.sources.local import LinkRefused
    from minilmd.corpus.sources.train_texts import tokenizer_hint
    from minilmd.corpus.tokenizer_beside import found_beside
    from minilmd.corpus.tokenizer_train import TokenizerError
    from minilmd.dirfd import PlaceRefused
    from minilmd.fsio import out_parent_problem, out_taken
    from minilmd.names import TOKENIZER_CONFIG

    written = [out] + ([str(Path(out).with_name(TOKENIZER_CONFIG))] if chat_template else [])
    refused = out_parent_problem(out, "--out", "the tokenizer", OUT_ADVICE, group_share=group_share)
    for taken in filter(None, [refused, *(out_taken(path, force) for path in written)]):
        typer.echo(f"tokenizer train: {_whose(taken, Path(out))}; nothing written", err=True)  # none wasted
        raise typer.Exit(EXIT_CONFIG)
    template_config = None
    if chat_template:
        try:
            template_config = checked_config(chat_template)  # a template that fails is said before the training
        except ChatTemplateError as e:
            raise data_error_exit(e) from None

    # as prepare: the training process is ended, nothing written
    with interruptible(f"tokenizer train: interrupted, nothing written ({out} is as it was)"):
        writing = False
        try:
            # the tokenizers library's bars where both are a terminal: it draws them on stderr and writes empty
            # lines on stdout; anywhere else (a log, a pipe) minilmd's own progress lines on stderr
            text, actual, bad = _train_in_child(corpus, on_bad_line, max_docs, vocab_size,
                                                sys.stdout.isatty() and sys.stderr.isatty())
            writing = True
            _write_tokenizer(out, text, group_share)
        except (InputError, TokenizerError, LinkRefused) as e:  # LinkRefused: another user's link among the sources
            raise data_error_exit(e) from None
        except PlaceRefused as e:  # looked at again when the directory is opened: rearranged during the training
            typer.echo(f"tokenizer train: {e}; nothing written", err=True)
            raise typer.Exit(EXIT_CONFIG) from None
        except OSError as e:
            if writing:  # the output's directory, as every command that writes one says it
                raise out_error_exit(e, "tokenizer train", out_dir_of(out), f"{out} is as it was") from None
            raise io_error_exit(e, "tokenizer train", f"{out} is as it was") from None
        except RuntimeError as e:  # the training failed otherwise (not a read or write: not exit 74)
            typer.echo(f"tokenizer train: the training failed: {e}; nothing written ({out} is as it was)", err=True)
            raise typer.Exit(COMMAND_FAILED) from None
    bad.log_skipped(lambda line: typer.echo(line, err=True), tokenizer_hint(bad))  # named as prepare names them
    typer.echo(f"wrote {out}: vocabulary of {actual}" + (f" (asked for {vocab_size})" if actual < vocab_size else ""))
    if template_config is None and (found := found_beside(Path(out))):  # not this one's: prepare will say so too
        typer.echo(f"tokenizer train: note: {found}; `minilmd tokenizer template {out} --chat-template minimind "
                   f"--out DIR` gives it one in a directory of its own", err=True)
    if template_config is not None:
        try:
            typer.echo(f"wrote {write_beside(out, template_config, text, group_share=group_share)}: chat template "
                       f"{chat_template}")
        except PlaceRefused as e:
            typer.echo(f"tokenizer train: {e}; the tokenizer_config.json was not written", err=True)
            raise typer.Exit(EXIT_CONFIG) from None
        except OSError as e:
            raise out_error_exit(e, "tokenizer train", out_dir_of(out),
                                 "the tokenizer_config.json was not written") from None


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

    from minilmd.corpus.progress import Progress
    from minilmd.corpus.sources.bad_tally import BadLineTally, InputError
    from minilmd.corpus.sources.local import LinkRefused
    from minilmd.corpus.sources.train_texts import iter_texts
    from minilmd.corpus.tokenizer_train import TokenizerError, train_tokenizer
    from minilmd.corpus.workers import start_worker

    start_worker(parent)  # deaf to the Ctrl-C the parent handles; a parent killed with SIGKILL takes it with it
    bad = BadLineTally()
    # prepare's progress, plain lines: the library's bars are the terminal's
    progress = None if show_progress else Progress(0, tty=False, name="tokenizer train")
    texts = iter_texts(corpus, on_bad_line, bad, progress)
    if max_docs > 0:
        texts = itertools.islice(texts, max_docs)
    try:
        tok = train_tokenizer(_then_training(texts, progress, vocab_size), vocab_size, None,
                              show_progress=show_progress)
        send.send((tok.to_str(pretty=True), tok.get_vocab_size(with_added_tokens=True), bad))
    except (InputError, TokenizerError, LinkRefused, OSError) as e:
        send.send(e)
    except Exception as e:  # noqa: BLE001 - anything else (a panic of the library, MemoryError) said as itself
        send.send(RuntimeError(f"{type(e).__name__}: {e}"))
    finally:
        if progress:
            progress.close()


def _then_training(texts, progress, vocab_size: int):
    """The texts, then the training phase said once they are all read (--max-docs: the first N): the library
    trains after its reader has taken the last one."""
    yield from texts
    if progress:
        progress.phase(f"training the BPE (--vocab-size {vocab_size})")


def _write_tokenizer(out: str, text: str, group_share: bool) -> None:
    """Written by this process, once the training is done: a kill of the training never leaves a temp file. A temp
    file renamed over `out`, so a kill mid-write leaves the old file; at the descriptor of --out's directory, opened
    once under the place rule (fsio.write_out_text, export's rule): a link at `out` is replaced, and one planted on
    the way (a teammate's link to the victim's directory) refused or not followed, never written through."""
    from pathlib import Path

    from minilmd.corpus.chat_templates import OUT_ADVICE
    from minilmd.fsio import write_out_text
    from minilmd.perms import published_file_mode

    write_out_text(Path(out), text, "--out", "the tokenizer", OUT_ADVICE, group_share=group_share,
                   mode=published_file_mode())  # as a corpus's files: only its owner writes it, whatever the umask


@tokenizer_app.command("template")
def tokenizer_template_command(
    tokenizer: str = typer.Argument(..., help="A tokenizer.json or a directory holding one."),
    chat_template: str = typer.Option(..., "--chat-template", help="minimind (MiniMind's ChatML, think block "
                                      "included) or FILE (a Jinja template, or a tokenizer_config.json whose "
                                      "chat_template is taken)."),
    out: str = typer.Option("", "--out", help="Where to write the tokenizer.json (a name ending in .json; anything "
                            "else is a directory to hold it), the tokenizer_config.json beside it. Default: "
                            "TOKENIZER's own, left as it is: only the tokenizer_config.json is written."),
    force: bool = force_option("an existing --out, or the tokenizer_config.json beside it, of yours: another user's "
                               "file or link there is never replaced, --force or not (exit 2)"),
    group_share: bool = group_share_option(),
) -> None:
    """Give an existing tokenizer a chat template, for prepare --format chat: its vocabulary unchanged (the same
    tokenizer.json, byte for byte), so a model pretrained with it can be fine-tuned on a chat corpus prepared with it.

    Exit status: 0, 2 bad arguments (a tokenizer minilmd cannot use, a template that does not load or render, an
    output already there without --force, or another user's with it, an --out directory other users can change
    without --group-share), 74 a write failed."""
    from pathlib import Path

    from minilmd.corpus.chat_templates import ChatTemplateError, checked_config, write_beside
    from minilmd.corpus.tokenizer import TokenizerError, read_tokenizer_text, tokenizer_from_text
    from minilmd.dirfd import PlaceRefused

    try:
        source = Path(tokenizer) / TOKENIZER_FILE if Path(tokenizer).is_dir() else Path(tokenizer)
    except OSError as e:  # a directory on the way this user may not look into
        typer.echo(f"tokenizer template: {tokenizer}: cannot be looked at ({e.strerror or e}); nothing written",
                   err=True)
        raise typer.Exit(EXIT_CONFIG) from None
    try:
        text = read_tokenizer_text(source)  # read once: what is checked is what is copied
        vocab = tokenizer_from_text(text, str(source)).get_vocab_size(with_added_tokens=True)
        config = checked_config(chat_template)
    except (TokenizerError, ChatTemplateError) as e:
        raise data_error_exit(e) from None
    target = source if not out else Path(out) if out.endswith(".json") else Path(out) / TOKENIZER_FILE
    in_place = _same_file(target, source)
    _refuse_taken_outputs("tokenizer template", target, in_place, force, group_share)
    try:
        if not in_place:
            _write_tokenizer(str(target), text, group_share)
        written = write_beside(target, config, text, group_share=group_share)
    except PlaceRefused as e:  # looked at again when the directory is opened: rearranged meanwhile
        typer.echo(f"tokenizer template: {e}", err=True)
        raise typer.Exit(EXIT_CONFIG) from None
    except OSError as e:
        raise out_error_exit(e, "tokenizer template", out_dir_of(target), "run it again to write both "
                             "files") from None
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
    from minilmd.fsio import out_parent_problem, out_taken
    from minilmd.names import TOKENIZER_CONFIG

    outputs = [target.with_name(TOKENIZER_CONFIG)] + ([] if in_place else [target])
    refused = out_parent_problem(target, "--out", "the tokenizer", OUT_ADVICE, group_share=group_share)
    for taken in filter(None, [refused, *(out_taken(path, force) for path in outputs)]):
        typer.echo(f"{what}: {_whose(taken, target)}; nothing written", err=True)
        raise typer.Exit(EXIT_CONFIG)


def _whose(taken: str, tokenizer) -> str:
    """The output rule's refusal, with whose chat template the tokenizer_config.json there is when it is another
    tokenizer's (minilmd/corpus/tokenizer_beside.py), and the ways on."""
    from pathlib import Path

    from minilmd.corpus.tokenizer_beside import found_beside
    from minilmd.names import TOKENIZER_CONFIG

    if not taken.startswith(str(Path(tokenizer).with_name(TOKENIZER_CONFIG))) or not (found := found_beside(
            Path(tokenizer))):
        return taken
    return (f"{found}: give {Path(tokenizer).name} a directory of its own (--out DIR), or pass --force to make the "
            f"template there {Path(tokenizer).name}'s (the other tokenizer then has none)")


@tokenizer_app.command("check")
def tokenizer_check_command(path: str = typer.Argument(..., help="A tokenizer.json or a directory holding one.")):
    """Check that a tokenizer has MiniMind's special ids and fits uint16 (exit 2 when not)."""
    from minilmd.corpus.tokenizer import TokenizerError, load_tokenizer

    try:
        tok = load_tokenizer(path)
    except TokenizerError as e:
        raise data_error_exit(e) from None
    typer.echo(f"{path}: usable, vocabulary of {tok.get_vocab_size(with_added_tokens=True)}")
