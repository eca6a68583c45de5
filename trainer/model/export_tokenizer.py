"""The tokenizer of a checkpoint's model, for an HF export (its tokenizer files), `minilmd sample` and `minilmd chat`:
tokenizer.json, and the chat template beside it (tokenizer_config.json; chat_template.jinja beside --tokenizer).

Looked for in this order: an explicit --tokenizer, the checkpoint, the prepared corpus its run trained on
(trainer_state config.data.prepared, a hint). Each file is read once, and what is used (written into an export,
loaded) is the bytes read, never the path opened again. How each place is read:
- --tokenizer is the user's own choice: a symbolic link there is followed (a Hugging Face cache is links into its
  blobs), and the file it leads to is read as untrusted all the same (regular only, so a FIFO is never opened;
  bounded).
- A checkpoint may be another user's or on a shared remote, a prepared corpus may be shared: their files are read
  as minilmd/untrusted.py reads one: no link followed (a link to someone's private file is never copied into an
  export), regular only (a FIFO never opened), bounded (TOKENIZER_MAX_BYTES, TOKENIZER_CONFIG_MAX_BYTES). A
  tokenizer.json must have the sha256 the run recorded (trainer_state fingerprints.tokenizer, the validated
  trainer_state's: the trainer copies that very file into each checkpoint) when the run recorded one, so a file
  swapped in after validation is refused. The manifest is not read again here: validation read it once, and its
  files table is not kept (minilmd/checkpoint.py Validated).
A file that is not there is passed by (the next place is tried); one that is there but refused is an ExportError
naming it and why, never silently replaced by another place's. minilmd's checkpoints and corpora carry the chat
template resolved in tokenizer_config.json, so chat_template.jinja is read beside --tokenizer only.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from minilmd.corpus.chat import TOKENIZER_CONFIG_MAX_BYTES
from minilmd.corpus.tokenizer import TOKENIZER_MAX_BYTES
from minilmd.names import TOKENIZER_CONFIG, TOKENIZER_FILE, TRAINER_STATE
from minilmd.trainer.model.export_paths import ExportError, resolve_checkpoint
from minilmd.untrusted import Unreadable, read_bytes, read_json

MAX_STATE_BYTES = 64 << 20
"""trainer_state.json read as a hint without validation (as checkpoint.MAX_JSON_PART bounds it)."""


@dataclass(frozen=True)
class FoundTokenizer:
    """A tokenizer.json as read once: where (for messages) and its bytes (what is written or loaded)."""

    path: Path
    data: bytes


def find_tokenizer(path: str | Path, explicit: str | Path | None = None, state: dict | None = None) -> FoundTokenizer:
    """The tokenizer for a checkpoint (module docstring): `explicit`, else tokenizer.json in the checkpoint, else
    the one of the prepared corpus the run trained on. `state`: the checkpoint's validated trainer_state when the
    caller has it (else trainer_state.json is read as a hint: `_state`)."""
    if explicit:
        return FoundTokenizer(Path(explicit), _read_explicit(Path(explicit), TOKENIZER_MAX_BYTES))
    ckpt = resolve_checkpoint(path)
    state = _state(ckpt, state)
    looked: list[str] = []
    for where in (ckpt, _corpus_dir(state)):
        if where is None:
            continue
        data = _read_untrusted(where / TOKENIZER_FILE, TOKENIZER_MAX_BYTES, looked)
        if data is not None:
            _check_fingerprint(where / TOKENIZER_FILE, data, state)
            return FoundTokenizer(where / TOKENIZER_FILE, data)
    raise ExportError(f"no tokenizer found for {ckpt} ({'; '.join(looked)}); pass --tokenizer PATH/tokenizer.json")


def find_chat_config(path: str | Path, explicit: str | Path | None = None, state: dict | None = None) -> dict | None:
    """The tokenizer_config.json with the chat template of a checkpoint's model (minilmd/corpus/chat.py
    chat_config): beside an explicit --tokenizer, else in the checkpoint (the trainer copies a chat corpus's),
    else in the prepared corpus it was trained on (`state` as find_tokenizer's). None when none of them has a
    template (a model pretrained on text)."""
    from minilmd.corpus.chat import ChatError, chat_config, read_tokenizer_config

    if explicit:
        try:
            return read_tokenizer_config(explicit)  # the user's own: its links followed, read bounded
        except ChatError:
            pass
    ckpt = resolve_checkpoint(path)
    looked: list[str] = []
    for where in (ckpt, _corpus_dir(_state(ckpt, state))):
        if where is None:
            continue
        data = _read_untrusted(where / TOKENIZER_CONFIG, TOKENIZER_CONFIG_MAX_BYTES, looked)
        if data is None:
            continue
        try:
            return chat_config(_utf8(where / TOKENIZER_CONFIG, data), None, where)
        except ChatError:
            continue
    return None


def _read_explicit(path: Path, max_bytes: int) -> bytes:
    """--tokenizer's file: its links followed (the user's own choice), then read as untrusted (a regular file, of
    at most max_bytes: a FIFO or a device named by mistake is refused, never opened)."""
    try:
        return read_bytes(path.resolve(), max_bytes=max_bytes)
    except Unreadable as e:
        raise ExportError(f"--tokenizer {path}: {'no such file' if e.missing else e.why}") from None


def _read_untrusted(path: Path, max_bytes: int, looked: list[str]) -> bytes | None:
    """A checkpoint's or a corpus's file, read as untrusted (module docstring); None, said in `looked`, when it is
    not there; ExportError when it is there but not a regular file of at most max_bytes."""
    try:
        return read_bytes(path, max_bytes=max_bytes)
    except Unreadable as e:
        if e.missing:
            looked.append(f"{path}: missing")
            return None
        raise ExportError(f"{path}: {e.why}: not read (a checkpoint's or a prepared corpus's file may be another "
                          f"user's); pass --tokenizer PATH/tokenizer.json") from None


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


def _state(ckpt: Path, state: dict | None) -> dict | None:
    """The validated trainer_state the caller has, else trainer_state.json read for its corpus hint alone, as
    untrusted (bounded, no link followed): `minilmd sample/chat --lora` validates the base given as CHECKPOINT
    where its state is not kept (adapter.py). None when it cannot be read."""
    if state is not None:
        return state
    try:
        return read_json(ckpt / TRAINER_STATE, max_bytes=MAX_STATE_BYTES)
    except Unreadable:
        return None


def _corpus_dir(state: dict | None) -> Path | None:
    """The local prepared corpus the run trained on (config.data.prepared): a hint, not needed."""
    try:
        prepared = state["config"]["data"]["prepared"]  # type: ignore[index]
    except (KeyError, TypeError):
        return None
    if isinstance(prepared, str) and prepared and "://" not in prepared:
        return Path(prepared)
    return None


def _utf8(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ExportError(f"{path}: not UTF-8") from None
