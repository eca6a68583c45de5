"""What is loaded is what was checked, parsed by the one parser (house8 item 4).

- A resume's load (trainer/checkpoint/save.py load) read model, optimizer, optimizer.json and trainer_state.json by
  path after find_latest had hashed them: a file swapped since was loaded unseen, a trainer_state.json of any size
  parsed, one nested deep enough raised RecursionError. Now each is read once, checked against the manifest, bounded
  (MAX_JSON_PART) and parsed from those bytes (checkpoint_load.for_loading).
- A DPO reference file's header was parsed a second time beside minilmd/safetensors_scan.py, with no bound and no
  depth cap: now by that one parser, refused with words.
- The sync's copy parsed the local manifest by path with json.loads, and read it again to compare the remote's.
"""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest
import torch

from minilmd import checkpoint as ck
from minilmd.corpus.sources.jsonl import loads_bounded
from minilmd.corpus_meta import CorpusError, parse_meta
from minilmd.daemon.jobs.sync_copy import _local_manifest
from minilmd.daemon.jobs.sync_errors import SyncError
from minilmd.trainer.checkpoint import save as ckpt_io
from weights_helpers import save_checkpoint, tiny_model

torch.set_num_threads(1)
DEEP = 100_000
"""Far deeper than json.loads can follow (RecursionError), far below any size cap."""


def rehash(ckpt: Path, name: str) -> None:
    """The manifest made to agree with `name` as it now is: every size and sha256 check passes."""
    manifest = json.loads((ckpt / ck.MANIFEST).read_text())
    data = (ckpt / name).read_bytes()
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / ck.MANIFEST).write_text(json.dumps(manifest))


@pytest.fixture
def ckpt(tmp_path) -> Path:
    return save_checkpoint(tmp_path / "ckpt", tiny_model(seed=1), step=1)


def test_a_part_changed_after_its_check_is_refused_not_loaded(ckpt):
    """trainer_state.json rewritten after find_latest hashed it (its manifest left as it was): loaded before."""
    before = (ckpt / ck.TRAINER_STATE).read_text()
    after = json.dumps({**json.loads(before), "tokens_seen": 123_456})
    (ckpt / ck.TRAINER_STATE).write_text(after.ljust(len(before)))  # its listed size: only the hash tells
    with pytest.raises(ck.CheckpointInvalid, match=f"{ck.TRAINER_STATE}.*sha256"):
        ckpt_io.load(ckpt)


@pytest.mark.parametrize("name", [ck.TRAINER_STATE, ck.OPTIMIZER_META])
def test_a_json_part_over_its_bound_is_refused_before_it_is_parsed(ckpt, name):
    """A padded trainer_state.json or optimizer.json its manifest vouches for: over MAX_JSON_PART, never read whole."""
    text = (ckpt / name).read_text()
    (ckpt / name).write_text(text + " " * (ck.MAX_JSON_PART + 1 - len(text)))
    rehash(ckpt, name)
    with pytest.raises(ck.CheckpointInvalid, match=f"cannot read {name}: over 4 MiB"):
        ckpt_io.load(ckpt)


def test_a_json_part_nested_too_deep_is_invalid_not_a_recursion_error(ckpt):
    (ckpt / ck.TRAINER_STATE).write_text("[" * DEEP + "]" * DEEP)
    rehash(ckpt, ck.TRAINER_STATE)
    with pytest.raises(ck.CheckpointInvalid, match=f"{ck.TRAINER_STATE}: nested deeper than 64"):
        ckpt_io.load(ckpt)


def test_an_intact_checkpoint_loads_with_what_it_carries(ckpt):
    (ckpt / "extra.bin").write_bytes(b"carried")
    rehash(ckpt, "extra.bin")
    model_state, optimizer_state, state, carried = ckpt_io.load_carrying(ckpt, {"extra.bin": 64, "absent": 64})
    assert state["step"] == 1 and carried == {"extra.bin": b"carried"}
    assert set(model_state) and optimizer_state["param_groups"]


def _reference(header: bytes, declared: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if declared is None else declared) + header


@pytest.mark.parametrize(("raw", "words"), [
    (_reference(b"{}", declared=1 << 40), "header length 1099511627776 does not fit a 10-byte file"),
    (_reference(b"[" * DEEP + b"]" * DEEP), "header is not a JSON object (nested deeper than 64)"),
    (_reference(b'{"__metadata__": {"reference": 3}}'), "__metadata__ is not an object of strings"),
], ids=["header-longer-than-the-file", "header-too-deep", "metadata-not-strings"])
def test_a_hostile_reference_header_is_refused_with_words_by_the_one_parser(tmp_path, raw, words):
    from minilmd.trainer.loop.dpo_reference import reference_sums

    with pytest.raises(CorpusError, match="not a reference file minilmd reads") as refused:
        reference_sums(raw, None, tmp_path / "step-00000000", {"seq_len": 64}, printing=False)  # type: ignore[arg-type]
    assert words in str(refused.value)


def test_the_syncs_local_manifest_is_read_once_bounded_and_deep_is_refused(tmp_path, ckpt):
    manifest, text = _local_manifest(ckpt)
    assert text == (ckpt / ck.MANIFEST).read_text() and manifest == json.loads(text)
    (ckpt / ck.MANIFEST).write_text("[" * DEEP + "]" * DEEP)
    with pytest.raises(SyncError, match="nested deeper than 64"):
        _local_manifest(ckpt)
    (ckpt / ck.MANIFEST).write_text(" " * (2 << 20))
    with pytest.raises(SyncError, match="over 1 MiB"):
        _local_manifest(ckpt)


def test_the_corpus_parsers_are_untrusted_loads_with_jsons_own_words():
    """loads_bounded (a corpus's lines) and meta.json's parse were copies of untrusted.loads: now it, keeping json's
    words where a line stops being JSON (a bad line's detail) and its depth bound."""
    with pytest.raises(ValueError, match=r"Expecting value: line 1 column 6 \(char 5\)"):
        loads_bounded('{"a":')
    with pytest.raises(ValueError, match="not UTF-8"):
        loads_bounded(b"\xff")
    with pytest.raises(CorpusError, match=r"meta.json: not valid JSON \(nested deeper than 64\)"):
        parse_meta(b"[" * DEEP + b"]" * DEEP, "meta.json")
