"""A prepared corpus's meta.json: read, its format and version checked, its file list checked for paths that stay
inside the corpus. Numpy-free, unlike the token stream (minilmd/corpus/format.py): the supervisor and the config
probes read meta.json before anything is staged, and `minilmd status` and the supervisor stay light. Format in
docs/formats.md. Also the corpus's data fingerprint and its earlier versions', which a checkpoint records.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import Any

from minilmd.names import CORPUS_META as META
from minilmd.names import CORPUS_META_MAX_BYTES, SPLITS
from minilmd.untrusted import Unreadable, loads_any, read_bytes

FORMAT = "minilmd-prepared"
VERSION = 1
"""The version of a text corpus (pretraining: loss on every token)."""
CHAT_VERSION = 2
"""The version of a chat corpus: a version-1 layout plus loss_mask.bin and tokenizer_config.json. Text corpora stay
at 1, so every minilmd reads them; a minilmd that knows only version 1 refuses a chat corpus instead of training on
its dialogue as plain text."""
DPO_VERSION = 3
"""The version of a preference corpus (`prepare --format dpo`): a chat corpus's layout whose documents are pairs,
chosen then rejected (docs/formats.md). Its own version, so that a minilmd that knows only chat corpora refuses it
instead of fine-tuning on the rejected replies as if they were good ones."""
DATA_FORMATS = {"text": VERSION, "chat": CHAT_VERSION, "dpo": DPO_VERSION}
"""meta.json's `data_format` (absent means "text") and the version it is written with."""
MASKED_FORMATS = ("chat", "dpo")
"""The data formats with a loss mask and a chat template (rendered conversations)."""


class CorpusError(ValueError):
    """An invalid prepared corpus; the message names the files and the numbers that disagree."""


def read_meta(root: str | Path) -> dict:
    """meta.json of a prepared corpus, after checking its format and version."""
    return read_meta_hashed(root)[0]


def read_meta_hashed(root: str | Path) -> tuple[dict, str]:
    """read_meta, and the sha256 of the very bytes it parsed (what an append records as the previous version's)."""
    path = Path(root) / META
    try:
        data = read_bytes(path, max_bytes=CORPUS_META_MAX_BYTES)
        meta = loads_any(data)
    except Unreadable as e:
        if e.missing:
            raise CorpusError(f"{path}: missing; is {root} the output of `minilmd prepare`?") from None
        if e.os_error is not None:  # a failing disk or mount, as before: the caller's retry or crash-restart
            raise e.os_error from None
        raise CorpusError(f"{path}: unreadable ({e.why})") from None
    except ValueError as e:
        raise CorpusError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CorpusError(f"{path}: format is {meta.get('format') if isinstance(meta, dict) else None!r}, "
                          f"expected {FORMAT!r}")
    data_format = meta.get("data_format", "text")
    if data_format not in DATA_FORMATS:
        raise CorpusError(f"{path}: data_format {data_format!r}, this minilmd reads {', '.join(DATA_FORMATS)}")
    if meta.get("version") != DATA_FORMATS[data_format]:
        raise CorpusError(f"{path}: version {meta.get('version')!r}, this minilmd reads version "
                          f"{DATA_FORMATS[data_format]} for data_format {data_format!r}; prepare the corpus again")
    return meta, hashlib.sha256(data).hexdigest()


def read_corpus_meta(prepared: str | Path) -> dict | None:
    """A local prepared corpus's meta.json, or None if it cannot be read (no format check: for what the config
    check and the space estimate take from it before staging). Its bytes are read each time (bounded), but parsed
    once for the same bytes (`_parsed`), however many of a command's checks ask (`run --check` parsed it five times,
    each a depth scan and json.loads of what may be another user's padded file); the dict is shared: read it, never
    change it."""
    try:
        return _parsed(read_bytes(Path(prepared) / META, max_bytes=CORPUS_META_MAX_BYTES))
    except ValueError:  # Unreadable too
        return None


@functools.lru_cache(maxsize=4)
def _parsed(raw: bytes) -> dict | None:
    """read_corpus_meta's parse of meta.json's bytes (the cache's key: the same bytes, the same dict)."""
    try:
        meta = loads_any(raw)
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def meta_value(meta: Any, *keys: str) -> Any:
    """meta[k1][k2]... or None where a level is missing or not a table (a meta.json read leniently)."""
    for key in keys:
        meta = meta.get(key) if isinstance(meta, dict) else None
    return meta


def corpus_train_tokens(prepared: str) -> int | None:
    """Train-split token count from a local prepared corpus's meta.json, or None if it cannot be read."""
    tokens = meta_value(read_corpus_meta(prepared), "splits", "train", "tokens")
    return tokens if isinstance(tokens, int) else None


def parse_meta(raw: bytes, where: str) -> dict:
    """meta.json's bytes as fetched from a corpus source (`where` names the file); CorpusError if not a JSON
    object."""
    try:
        meta = loads_any(raw)
    except ValueError as e:  # not UTF-8, too deep too
        raise CorpusError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise CorpusError(f"{where}: not a JSON object")
    return meta


def listed_files(meta: dict, where: str) -> dict[str, dict]:
    """meta["files"] checked for shape and for paths that stay inside the corpus directory (what staging copies);
    CorpusError naming `where` otherwise."""
    if meta.get("format") != FORMAT:
        raise CorpusError(f"{where}: meta.json has format {meta.get('format')!r}, expected {FORMAT!r} "
                          f"(is this the output of `minilmd prepare`?)")
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        raise CorpusError(f"{where}: meta.json lists no files (key \"files\")")
    for rel, entry in files.items():
        p = PurePosixPath(rel)
        if p.is_absolute() or ".." in p.parts or rel == META or "\0" in rel:  # a NUL: no file's name (ValueError)
            raise CorpusError(f"{where}: meta.json lists an unsafe file name {rel!r}")
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                and isinstance(entry.get("sha256"), str)):
            raise CorpusError(f"{where}: meta.json entry for {rel!r} needs an integer size and a sha256")
    return files


def data_format_of(meta: dict) -> str:
    """"text", "chat" or "dpo": meta.json's `data_format`, absent meaning "text" (corpora from before chat existed)."""
    return meta.get("data_format", "text")


CORPUS_SUMMARY = "corpus"
"""trainer_state.json's key for `corpus_summary`."""


def corpus_summary(meta: dict) -> dict:
    """What a checkpoint records of the corpus it trained on, for counting its documents later (the update share of
    a stage started from it, minilmd/plan/update_share.py): its data format and the train split's documents and
    tokens. The config the checkpoint records names the staged copy in scratch, gone once the run has ended."""
    train = meta_value(meta, "splits", "train") or {}
    return {"data_format": data_format_of(meta),
            "splits": {"train": {k: train[k] for k in ("documents", "tokens") if isinstance(train.get(k), int)}}}


def data_fingerprint(meta: dict) -> str:
    """sha256 over the sorted (path, sha256) of the train/val files: same data, same fingerprint."""
    pairs = sorted((p, f["sha256"]) for p, f in meta.get("files", {}).items() if p.split("/")[0] in SPLITS)
    return hashlib.sha256("".join(f"{p}\0{h}\n" for p, h in pairs).encode()).hexdigest()


def earlier_versions(meta: dict) -> dict[str, dict]:
    """{data fingerprint: its `versions` entry} of every version before this one (`prepare --append`): a
    checkpoint of a run on one of them may resume on this corpus (minilmd/plan/growth.py)."""
    current = data_fingerprint(meta)
    return {v["data_fingerprint"]: v for v in meta.get("versions", [])
            if isinstance(v, dict) and v.get("data_fingerprint") not in (None, current)}


OWNER_LOOKS = 64
"""The most files of meta.json's list whose owner owner_note looks at (a corpus lists a handful)."""


def owner_note(prepared: str | None, meta: dict | None = None, key: str = "data.prepared") -> str:
    """One line naming the owner of a local prepared corpus when its directory, its meta.json or a file it lists
    is not this user's ("data.prepared /x belongs to user mal2 (uid 1002) ..."), or when a directory above it is
    another user's or can be written by others (minilmd/source_owner.py above_words, the rule init.from's and
    export's checkpoints are said by too): another user's corpus is trained on by design (docs/failure-modes.md),
    but said, by `run --check`, the launch log and `status`, since a corpus in a team directory can be replaced by
    a teammate. "" when all are this user's or root's (root's files are trusted by every other rule too), for a
    URL, and for what cannot be looked at (the checks say that). `meta`: meta.json as already read (None: read
    here)."""
    from minilmd.perms import owned_by_me_or_root, owner_in, user_words
    from minilmd.source_owner import above_words, whose
    from minilmd.urls import is_url

    if not prepared or is_url(prepared):
        return ""
    root = Path(prepared)
    try:
        top = os.stat(root)  # the path as the config names it (a link of the user's to a share is the user's word)
    except OSError:
        return ""
    meta = read_corpus_meta(root) if meta is None else meta
    try:
        listed = list(listed_files(meta, prepared))[:OWNER_LOOKS] if isinstance(meta, dict) else []
    except CorpusError:
        listed = []
    others: dict[int, str] = {}  # uid -> the first file of its found, where it is not the directory's owner
    for rel in (META, *listed):
        try:
            st = os.lstat(root / rel)
        except OSError:
            continue
        if not owned_by_me_or_root(st) and not owner_in(st, (top.st_uid,)):
            others.setdefault(st.st_uid, rel)
    above = above_words(root, {top.st_uid, *others})
    if owned_by_me_or_root(top) and not others and not above:  # root's (an admin's corpus under /data): as ours
        return ""
    said = [f"{key} {prepared} {whose(top)}"]
    said += [f"its {rel} belongs to {user_words(uid)}" for uid, rel in others.items()]
    return ", ".join(said + above) + ": trained on as it is (another user's corpus is allowed); check it is the " \
                                     "one you mean"
