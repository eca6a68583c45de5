"""Whose a tokenizer_config.json (and a chat_template.jinja) is: the files a directory holds beside its tokenizer
belong to one tokenizer, not to every tokenizer of that directory.

Before, `tokenizer train --out tokB.json` (no --chat-template) in a directory that held tok.json and tok.json's
tokenizer_config.json gave tokB a template: `prepare --format chat --tokenizer tokB.json` rendered with tok.json's
and wrote it into the corpus; and `tokenizer template tokT.json` was refused because tok.json's config was there.

The rule: the config `tokenizer train --chat-template` and `tokenizer template` write records the tokenizer it was
written for, its file name and sha256 (RECORD); it applies to that tokenizer only (the same name and the same
bytes: one retrained over that name since has no template until it is given one). A config without that record
(transformers', one written by hand or by an older minilmd) applies to the directory's tokenizer.json (the layout
transformers loads), or, where the directory has no tokenizer.json, to the tokenizer when it is the directory's only
.json file besides the config (told by a listing of at most untrusted.MAX_DIR_ENTRIES entries: a directory that holds
more, or cannot be listed, gives such a config to no tokenizer, and says so). The record is minilmd's own: it is
dropped from the config a corpus, a checkpoint or an export carries (chat_files.read_tokenizer_config), where the
tokenizer is that directory's tokenizer.json.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from minilmd.names import TOKENIZER_CONFIG, TOKENIZER_FILE

RECORD = "minilmd_tokenizer"
"""The key of a tokenizer_config.json naming its tokenizer: {"file": NAME, "sha256": HEX}."""
RECORDS_ITS_OWN = "`minilmd tokenizer template TOKENIZER --chat-template ... --force` records its own"


def record_for(tokenizer_file: Path, text: str | bytes) -> dict:
    """The RECORD of the tokenizer `tokenizer_file` whose bytes (or text) are `text`."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return {"file": tokenizer_file.name, "sha256": hashlib.sha256(data).hexdigest()}


def owner_of(config: dict, folder: Path) -> str | None:
    """The file name of the tokenizer `config` (a tokenizer_config.json in `folder`) belongs to; None when no
    tokenizer of that directory can be told (no record, no tokenizer.json, several .json files). Unreadable when
    `folder` cannot be listed, or holds too many entries to be (untrusted.dir_names: another user may fill it)."""
    from minilmd.untrusted import dir_names

    recorded = config.get(RECORD)
    if isinstance(recorded, dict) and isinstance(recorded.get("file"), str):
        return recorded["file"]
    if os.path.lexists(folder / TOKENIZER_FILE):  # transformers' layout (a directory named: its tokenizer.json)
        return TOKENIZER_FILE
    files = [n for n in dir_names(folder) if n.endswith(".json") and n != TOKENIZER_CONFIG]
    if not files:
        return TOKENIZER_FILE
    return files[0] if len(files) == 1 else None


def belongs(config: dict, tokenizer_file: Path, tokenizer_bytes: bytes | None) -> str:
    """"" when `config` (the tokenizer_config.json beside `tokenizer_file`) is that tokenizer's; else why not, in
    words naming whose it is. `tokenizer_bytes`: the tokenizer's bytes, to check a recorded sha256 (None: not
    checked)."""
    from minilmd.untrusted import Unreadable

    folder, name = tokenizer_file.parent, tokenizer_file.name
    where = folder / TOKENIZER_CONFIG
    try:
        owner = owner_of(config, folder)
    except Unreadable as e:
        return (f"{where} records no tokenizer and {folder} cannot be listed ({e.why}): it is no tokenizer's there "
                f"for certain; {RECORDS_ITS_OWN}")
    if owner is None:
        return (f"{where} records no tokenizer and {folder} holds several (and no {TOKENIZER_FILE}): it is none of "
                f"them for certain; {RECORDS_ITS_OWN}")
    if owner != name:
        return f"{where} is {owner}'s (" + ("it records it" if RECORD in config else "the directory's "
                                            f"{owner}") + f"), not {name}'s"
    recorded = config.get(RECORD)
    sha = recorded.get("sha256") if isinstance(recorded, dict) else None
    if isinstance(sha, str) and tokenizer_bytes is not None and hashlib.sha256(tokenizer_bytes).hexdigest() != sha:
        return f"{where} was written for another {name} (sha256 {sha[:12]}; a tokenizer trained over it since)"
    return ""


def without_record(config: dict) -> dict:
    """`config` as a corpus, a checkpoint or an export carries it: beside their own tokenizer.json."""
    return {k: v for k, v in config.items() if k != RECORD}


def found_beside(tokenizer_file: Path) -> str:
    """What `tokenizer train` and `tokenizer template` say of a tokenizer_config.json already beside
    `tokenizer_file` that is another tokenizer's ("" when there is none, or it is this one's, or it cannot be
    read: the output rule says it is there)."""
    from minilmd.corpus.sources.jsonl import loads_bounded
    from minilmd.names import TOKENIZER_CONFIG_MAX_BYTES
    from minilmd.untrusted import Unreadable, read_bytes

    where = tokenizer_file.with_name(TOKENIZER_CONFIG)
    try:
        config = loads_bounded(read_bytes(where, max_bytes=TOKENIZER_CONFIG_MAX_BYTES).decode("utf-8"))
    except (Unreadable, OSError, ValueError):
        return ""
    try:
        owner = owner_of(config, tokenizer_file.parent) if isinstance(config, dict) else None
    except Unreadable:
        return ""  # prepare says why, when it is given this tokenizer
    if owner is None or owner == tokenizer_file.name:
        return ""
    return (f"{where} is {owner}'s chat template (one directory holds one tokenizer_config.json, "
            f"{tokenizer_file.name} has none there)")
