"""An init record in words: the fingerprint a stage keeps of its init.from (minilmd/init_source.py fingerprint), said
in messages, `status`, the lineage and the trainer's "initialised from" line; one spelling for all of them. Torch-free.
"""
from __future__ import annotations

from minilmd.names import BEST, LATEST
from minilmd.untrusted import clipped


def describe(record: dict | None, path_shown: int | None = None, whose: str = "") -> str:
    """A fingerprint record in one phrase, for messages, `status` and the lineage (daemon/phases/initwait.py, which
    reads another user's record: its path cut to `path_shown` characters, untrusted.clipped, and its step to 24;
    `whose`: source_owner.owner_words). A .pth records no step nor where it came from (MiniMind's weights, or
    `minilmd export --merge`'s of a LoRA run): said as one (before, the lineage read `merged.pth (step -, ...)`)."""
    if not record:
        return "nothing recorded"
    path = str(record.get("path"))
    path = clipped(path, path_shown) if path_shown is not None else path
    whose = f", {whose}" if whose else ""
    if record.get("kind") == "checkpoint":
        sha = str(record.get("manifest_sha256"))[:12]
        via = f", its {record['pointer']}" if record.get("pointer") in (BEST, LATEST) else ""  # taken through it
        return f"{path} (step {clipped(str(record.get('step')), 24)}{via}, manifest sha256 {sha}{whose})"
    sha = str(record.get("sha256"))[:12]
    if record.get("kind") == "minimind":
        return f"{path} (a .pth: weights alone, no step nor source recorded; sha256 {sha}{whose})"
    return f"{path} (sha256 {sha}{whose})"


def chosen(record: dict | None) -> str:
    """What the trainer's "initialised from" line says of the checkpoint it took: "", " (its BEST: ...)" or
    " (its LATEST)"."""
    pointer = (record or {}).get("pointer")
    if pointer == BEST:
        return " (its BEST: its best validation by its early_stop.metric)"
    return f" (its {LATEST})" if pointer == LATEST else ""
