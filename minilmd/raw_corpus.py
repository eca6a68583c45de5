"""A raw corpus where a prepared one belongs (data.prepared naming a .jsonl, .txt or .parquet file): the
`minilmd prepare` command to run instead, its --format told from the file's first line by the keys prepare's readers
tell formats apart by (minilmd/corpus/sources/line_shape.py imports them from here: one rule).

The file may sit in a shared place: its first line is read only from a regular file of this user's or root's (no
link followed, no FIFO opened), at most SNIFF_BYTES of it, parsed with the depth bound of minilmd/untrusted.py.
"""
from __future__ import annotations

import os
import shlex
from pathlib import PurePath

from minilmd import names
from minilmd.perms import own_uid
from minilmd.untrusted import Unreadable, loads, open_regular

CHAT_KEYS = ("conversations", "messages")
"""What a line of chat data holds (MiniMind's "conversations", the OpenAI style's "messages")."""
DPO_KEYS = ("chosen", "rejected")
"""What a preference pair holds."""
SNIFF_BYTES = 1 << 20
"""The most of a file read to find its first line (a MiniMind SFT line is a few KiB)."""
JSONL_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst")


def line_format(obj: object) -> str | None:
    """The format ("dpo", "chat" or "text") a JSON line is of, told in line_shape.other_format's order (a
    preference pair first: it is no chat line, whatever else it holds); None for none of them."""
    if not isinstance(obj, dict):
        return None
    if all(key in obj for key in DPO_KEYS):
        return "dpo"
    if any(key in obj for key in CHAT_KEYS):
        return "chat"
    return "text" if "text" in obj else None


def prepare_hint(path: str, seq_len: int) -> str:
    """What to run for the raw corpus `path` ("" when its name is none a corpus is written in): the prepare
    command (a .txt or .parquet converted to JSON lines first), then data.prepared set to its --out."""
    name = PurePath(path).name
    if name == names.CORPUS_META:  # a prepared corpus named by its meta.json, not a raw one
        return (f"data.prepared names a prepared corpus's directory, not its meta.json: set data.prepared = "
                f"{str(PurePath(path).parent)!r}")
    suffix = next((s for s in JSONL_SUFFIXES if name.endswith(s)), "")
    if not suffix and not name.endswith((".txt", ".parquet")):
        return ""
    stem = PurePath(path).with_name(name.removesuffix(suffix) if suffix else PurePath(name).stem)
    jsonl, out = f"{stem}.jsonl", f"{stem}-prepared"
    fmt = "text" if name.endswith(".txt") else _first_line_format(path) if suffix in (".jsonl", ".json") else None
    prepare = (f"`minilmd prepare {shlex.quote(path if suffix else jsonl)} --format {fmt or 'text'} --tokenizer "
               f"TOKENIZER --seq-len {seq_len} --out {shlex.quote(out)}`"
               + ("" if fmt else " (--format chat for conversations, dpo for preference pairs)")
               + f", then set data.prepared = {out!r}")
    if name.endswith(".txt"):
        return (f"a text file is a raw corpus: prepare reads JSON lines, so make each document a {{\"text\": ...}} "
                f"line (`jq -R -c '{{text: .}}' {shlex.quote(path)} > {shlex.quote(jsonl)}`, one line a document), "
                f"then run {prepare}")
    if name.endswith(".parquet"):
        code = (f"import pandas as pd; pd.read_parquet({path!r}).to_json({jsonl!r}, orient='records', lines=True, "
                "force_ascii=False)")  # Python literals inside, the whole quoted for the shell: a path is no code
        return (f"a Parquet file is a raw corpus: prepare reads JSON lines, so write it as such (`python -c "
                f"{shlex.quote(code)}`), then run {prepare}")
    return f"a raw corpus: run {prepare}"


def _first_line_format(path: str) -> str | None:
    """line_format of the file's first non-blank line, or None when it cannot be told (not a regular file of this
    user's or root's, unreadable, a first line past SNIFF_BYTES, not JSON)."""
    try:
        fd = open_regular(path, owner=(own_uid(), 0))
    except Unreadable:
        return None
    try:
        head = os.read(fd, SNIFF_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    for line in head.splitlines()[:-1] if len(head) == SNIFF_BYTES else head.splitlines():  # whole lines only
        if line.strip():
            try:
                return line_format(loads(line, expect=None))
            except ValueError:
                return None
    return None


def dir_prepare_hint(path: str, seq_len: int) -> str:
    """What to run for a directory of raw JSON lines named as data.prepared (no meta.json in it, some *.jsonl,
    *.jsonl.gz or *.jsonl.zst): the prepare command over them, then data.prepared set to its --out; "" when it holds
    none (or cannot be listed: the names are only read, at most MAX_DIR_ENTRIES of them). A *.json is not taken for
    one (a prepared corpus copied without its meta.json holds tokenizer.json; a model directory config.json)."""
    from minilmd.untrusted import Unreadable, dir_names

    try:
        found = sorted({s for name in dir_names(path) for s in JSONL_SUFFIXES if name.endswith(s) and ".jsonl" in s})
    except (Unreadable, OSError):
        return ""
    if not found:
        return ""
    where = PurePath(path)
    out = f"{where}-prepared"
    files = " ".join(f"{shlex.quote(str(where))}/*{suffix}" for suffix in found)
    fmt = _dir_format(path, found)
    return (f"it holds raw JSON lines: `minilmd prepare {files}{f' --format {fmt}' if fmt else ''} --tokenizer "
            f"TOKENIZER --seq-len {seq_len} --out {shlex.quote(out)}`"
            f"{'' if fmt else ' (--format chat for conversations, dpo for preference pairs)'}, then set "
            f"data.prepared = {out!r}")


MAX_SNIFFED = 16
"""The most files of a directory of raw JSON lines whose first lines dir_prepare_hint reads."""


def _dir_format(path: str, suffixes: list[str]) -> str | None:
    """The one format the directory's *.jsonl files are of, by each one's first line (_first_line_format: regular
    files of this user's or root's only); None when it cannot be told: compressed files (not read here), more than
    MAX_SNIFFED files, one that cannot be read, or files of several formats. Before, the command said no --format:
    pasted for a directory of chat files it read them as text and refused every line (a new user's LoRA stage)."""
    from minilmd.untrusted import Unreadable, dir_names

    if suffixes != [".jsonl"]:
        return None
    try:
        plain = sorted(name for name in dir_names(path) if name.endswith(".jsonl"))
    except (Unreadable, OSError):
        return None
    if len(plain) > MAX_SNIFFED:
        return None
    formats = {_first_line_format(str(PurePath(path) / name)) for name in plain}
    return formats.pop() if len(formats) == 1 else None
