"""The tokenizer files of a checkpoint, found and read once: for an export, `minilmd sample` and `minilmd chat`.

Apart from export.py (which writes the weights out): finding and vetting a checkpoint's tokenizer is one concern of
its own, with its own trust rules, and sample and chat use it without exporting anything.

The tokenizer files (`find_tokenizer`, `find_chat_config`; export.py writes them, `minilmd sample` and `minilmd chat`
load them): looked for in this order: an explicit --tokenizer, the checkpoint, the prepared corpus its run trained on
(trainer_state config.data.prepared, a hint). Each file is read once, and what is used (written into an export, loaded)
is the bytes read, never the path opened again. --tokenizer is the user's own choice: a symbolic link there is followed
(a Hugging Face cache is links into its blobs), and the file it leads to is read as untrusted all the same (regular
only, so a FIFO is never opened; bounded), and must have the model's vocabulary size (config.model.vocab_size; another
is TokenizerMismatch, exit 2: its ids would decode as other text). A checkpoint may be another user's or on a shared
remote, a prepared corpus may be shared: their files are read as minilmd/untrusted.py reads one: no link followed (a
link to someone's private file is never copied into an export), regular only, bounded (TOKENIZER_MAX_BYTES,
TOKENIZER_CONFIG_MAX_BYTES). An export takes the checkpoint's own tokenizer files from its one validation
(Validated.tokenizer, .tokenizer_config: the bytes hashed against the manifest as it read them, so a file swapped in
after validation is never what is exported); one in the directory that the manifest does not list was not written by the
trainer (which lists every file it writes, and always has) and is refused unread; `minilmd sample` and `minilmd chat`
keep their load's validation and do the same. A tokenizer.json must have the sha256 the run recorded (trainer_state
fingerprints.tokenizer, of the validated trainer_state: the trainer copies that very file into each checkpoint) when the
run recorded one. A file not there is passed by (the next place is tried), so is the corpus's when unreadable (only
named by the trainer_state: gone, or private); one there but refused is an ExportError naming it and why. The chat
template is resolved in tokenizer_config.json (chat_template.jinja: beside --tokenizer only).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from minilmd.checkpoint import Validated
from minilmd.names import (
    MANIFEST,
    TOKENIZER_CONFIG,
    TOKENIZER_FILE,
    TOKENIZER_MAX_BYTES,
    TRAINER_STATE,
    TRAINER_STATE_MAX_BYTES,
)
from minilmd.protocol import EXIT_CONFIG
from minilmd.trainer.model.export_paths import ExportError, read_explicit
from minilmd.trainer.model.export_source import resolve_checkpoint
from minilmd.untrusted import Unreadable, file_kind, read_bytes, read_json, size_text
from minilmd.urls import is_url


@dataclass(frozen=True)
class FoundTokenizer:
    """A tokenizer.json as read once: where (for messages) and its bytes (what is written or loaded)."""

    path: Path
    data: bytes


def find_tokenizer(path: str | Path, explicit: str | Path | None = None, *,
                   checked: Validated | None = None) -> FoundTokenizer:
    """The tokenizer for a checkpoint (module docstring: the tokenizer files): `explicit`, else tokenizer.json in
    the checkpoint, else the one of the prepared corpus the run trained on. `checked`: the checkpoint's one
    validation when the caller has it (its trainer_state, and its own tokenizer.json as that read hashed it);
    else trainer_state.json is read as a hint (`_state`)."""
    if explicit:
        given = read_explicit(Path(explicit), TOKENIZER_MAX_BYTES)
        _check_vocab(Path(explicit), given, checked.state if checked is not None else _state(resolve_checkpoint(path)))
        return FoundTokenizer(Path(explicit), given)
    ckpt = checked.path if checked is not None else resolve_checkpoint(path)  # LATEST may have moved on since
    state = checked.state if checked is not None else _state(ckpt)
    looked: list[str] = []
    for where in (ckpt, _corpus_dir(state)):
        if where is None:
            continue
        if where == ckpt:
            data = _checkpoint_file(ckpt, TOKENIZER_FILE, TOKENIZER_MAX_BYTES, looked, checked)
        else:
            data = _read_untrusted(where / TOKENIZER_FILE, TOKENIZER_MAX_BYTES, looked, hint=True)
        if data is not None:
            _check_fingerprint(where / TOKENIZER_FILE, data, state)
            return FoundTokenizer(where / TOKENIZER_FILE, data)
    raise ExportError(f"no tokenizer found for {ckpt} ({'; '.join(looked)}); pass --tokenizer PATH/tokenizer.json")


def find_chat_config(path: str | Path, explicit: str | Path | None = None, *,
                     checked: Validated | None = None) -> dict | None:
    """The tokenizer_config.json with the chat template of a checkpoint's model (minilmd/corpus/chat.py
    chat_config): beside an explicit --tokenizer, else in the checkpoint (the trainer copies a chat corpus's),
    else in the prepared corpus it was trained on (`checked` as find_tokenizer's). None when none of
    them has a template (a model pretrained on text)."""
    from minilmd.corpus.chat import ChatError
    from minilmd.corpus.chat_files import chat_config, read_tokenizer_config
    from minilmd.names import TOKENIZER_CONFIG_MAX_BYTES

    if explicit:
        try:
            return read_tokenizer_config(explicit)  # the user's own: its links followed, read bounded
        except ChatError:
            pass
    ckpt = checked.path if checked is not None else resolve_checkpoint(path)  # LATEST may have moved on since
    for where in (ckpt, _corpus_dir(checked.state if checked is not None else _state(ckpt))):
        if where is None:
            continue
        if where == ckpt:  # none: a text model
            data = _checkpoint_file(ckpt, TOKENIZER_CONFIG, TOKENIZER_CONFIG_MAX_BYTES, [], checked)
        else:
            data = _read_untrusted(where / TOKENIZER_CONFIG, TOKENIZER_CONFIG_MAX_BYTES, [], hint=True)
        if data is None:
            continue
        try:
            return chat_config(_utf8(where / TOKENIZER_CONFIG, data), None, where)
        except ChatError:
            continue
    return None


def _checkpoint_file(ckpt: Path, name: str, max_bytes: int, looked: list[str],
                     checked: Validated | None) -> bytes | None:
    """A tokenizer file of the checkpoint itself. With its validation (`checked`): the bytes that read hashed
    against the manifest, never the path opened again; a file by that name the manifest does not list is no part
    of the checkpoint (the trainer lists every file it writes into one, and always has), so it is refused unread,
    never taken for the run's. Without (`minilmd sample`, `minilmd chat`, which keep only the trainer_state of
    their load): read as untrusted, `_read_untrusted`."""
    if checked is None:
        return _read_untrusted(ckpt / name, max_bytes, looked)
    data = {TOKENIZER_FILE: checked.tokenizer, TOKENIZER_CONFIG: checked.tokenizer_config}[name]
    if data is not None:
        return data
    path = ckpt / name
    if name in checked.over_bound:
        from minilmd.checkpoint import TOKENIZER_FILES

        raise ExportError(f"{path}: listed over {size_text(TOKENIZER_FILES[name])}, the most a tokenizer file is "
                          f"read: not read; pass --tokenizer PATH/tokenizer.json")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        looked.append(f"{path}: missing")
        return None
    except OSError as e:
        raise ExportError(f"{path}: cannot be looked at ({e.strerror or e}); pass --tokenizer PATH/tokenizer.json") \
            from None
    raise ExportError(f"{path}: {file_kind(mode)} that the checkpoint's {MANIFEST} does not list: not read (the "
                      f"trainer lists every file it writes into a checkpoint; this one was put there since, by "
                      f"whoever can write it); remove it, or pass --tokenizer PATH/tokenizer.json")


def _read_untrusted(path: Path, max_bytes: int, looked: list[str], hint: bool = False) -> bytes | None:
    """A checkpoint's or a corpus's file, read as untrusted (module docstring: the tokenizer files); None, said in
    `looked`, when it is not there, or (`hint`: the prepared corpus, a place the trainer_state only names) when it
    cannot be read: another user's private corpus, a path through a file, EIO. ExportError when it is there but
    not a regular file of at most max_bytes."""
    try:
        return read_bytes(path, max_bytes=max_bytes)
    except Unreadable as e:
        if e.missing or (hint and e.kind == "io"):
            looked.append(f"{path}: {'missing' if e.missing else e.why}")
            return None
        raise ExportError(f"{path}: {e.why}: not read (a checkpoint's or a prepared corpus's file may be another "
                          f"user's); pass --tokenizer PATH/tokenizer.json") from None


class TokenizerMismatch(ExportError):
    """A --tokenizer whose vocabulary is not the model's: a usage error (exit 2). Its ids name other pieces of text
    than the model learnt, so what it decodes is mojibake, never an error of its own."""

    exit_status = EXIT_CONFIG


def _check_vocab(path: Path, data: bytes, state: dict | None) -> None:
    """--tokenizer must have the vocabulary size of the model (trainer_state config.model.vocab_size, which the
    trainer made sure was its corpus's tokenizer's), when the checkpoint records it."""
    from tokenizers import Tokenizer

    try:
        model_vocab = state["config"]["model"]["vocab_size"]  # type: ignore[index]
    except (KeyError, TypeError):
        return
    try:
        size = Tokenizer.from_buffer(data).get_vocab_size(with_added_tokens=True)
    except Exception as e:  # noqa: BLE001 - the tokenizers library's own error types
        raise ExportError(f"--tokenizer {path}: not a tokenizer.json the tokenizers library loads ({e})") from None
    if isinstance(model_vocab, int) and size != model_vocab:
        raise TokenizerMismatch(f"--tokenizer {path}: a vocabulary of {size:,} entries, but the model's is "
                                f"{model_vocab:,} (model.vocab_size): its text would decode as other text; pass the "
                                f"tokenizer the run trained with (without --tokenizer, the checkpoint's own)")


def _check_fingerprint(path: Path, data: bytes, state: dict | None) -> None:
    """A tokenizer.json must be the one the run trained with, when its trainer_state records which."""
    try:
        recorded = state["fingerprints"]["tokenizer"]  # type: ignore[index]
    except (KeyError, TypeError):
        return
    if isinstance(recorded, str) and hashlib.sha256(data).hexdigest() != recorded:
        raise ExportError(f"{path}: not the tokenizer the checkpoint's run trained with (its sha256 differs from "
                          f"the run's record, trainer_state fingerprints.tokenizer); pass --tokenizer "
                          f"PATH/tokenizer.json")


def _state(ckpt: Path) -> dict | None:
    """trainer_state.json read for its corpus hint alone, as untrusted (bounded, no link followed), where the
    caller has no validation of the checkpoint: `minilmd sample/chat --lora` validates the base given as CHECKPOINT
    where its validation is not kept (adapter.py). None when it cannot be read."""
    try:
        return read_json(ckpt / TRAINER_STATE, max_bytes=TRAINER_STATE_MAX_BYTES)
    except Unreadable:
        return None


def _corpus_dir(state: dict | None) -> Path | None:
    """The local prepared corpus the run trained on (config.data.prepared): a hint, not needed."""
    try:
        prepared = state["config"]["data"]["prepared"]  # type: ignore[index]
    except (KeyError, TypeError):
        return None
    if isinstance(prepared, str) and prepared and not is_url(prepared):
        return Path(prepared)
    return None


def _utf8(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ExportError(f"{path}: not UTF-8") from None
