"""minilmd/base_copy.py: what a LoRA base's kept copy's record and manifest list, the one reading of the daemon's
fetch (daemon/jobs/basecopy.py) and `export --merge`'s private copy (trainer/model/basecopy_read.py)."""
from __future__ import annotations

import hashlib
import json

import pytest

from minilmd.base_copy import copy_of, listed_files, parse_record
from minilmd.checkpoint import FORMAT, REQUIRED_FILES, VERSION
from minilmd.untrusted import Unreadable


def _manifest(**files) -> bytes:
    entries = {name: {"size": 10, "sha256": "0" * 64} for name in REQUIRED_FILES}
    entries.update(files)
    return json.dumps({"format": FORMAT, "version": VERSION, "step": 4, "files": entries}).encode()


def _record(manifest: bytes) -> dict:
    return {"from": "/share/base", "kind": "checkpoint", "manifest_sha256": hashlib.sha256(manifest).hexdigest()}


def test_a_checkpoint_bases_files_are_its_manifests_with_their_sizes():
    manifest = _manifest()
    files = listed_files(_record(manifest), manifest, max_pth=None)
    assert files == {f"checkpoint/{name}": (10, None) for name in REQUIRED_FILES}


@pytest.mark.parametrize(("manifest", "said"), [
    (_manifest(**{"../../etc/passwd": {"size": 1, "sha256": "0" * 64}}), "bad entry for '../../etc/passwd'"),
    (_manifest(**{"manifest.json": {"size": 1, "sha256": "0" * 64}}), "lists itself"),
    (b"[" * 100, "nested deeper"),
])
def test_a_manifest_hashed_by_its_record_is_still_checked(manifest, said):
    """The record is as untrusted as the manifest: one that hashes a hostile manifest gets no file outside the
    copy, nor the manifest listed as its own file, nor a parser's recursion."""
    with pytest.raises(Unreadable, match=said) as refused:
        listed_files(_record(manifest), manifest, max_pth=None, where="remote/init")
    assert refused.value.path == "remote/init/checkpoint/manifest.json"


def test_a_manifest_other_than_the_records_is_refused():
    with pytest.raises(Unreadable, match="not the manifest its source.json hashes"):
        listed_files(_record(_manifest()), _manifest(extra={"size": 1, "sha256": "0" * 64}), max_pth=None)


def test_a_pth_bases_size_is_its_records_word_bounded_by_the_model():
    assert listed_files({"kind": "minimind", "size": 4096}, None, max_pth=1 << 20) == \
        {"weights.pth": (4096, 1 << 20)}
    assert listed_files({"kind": "minimind", "size": "4096"}, None, max_pth=1 << 20) == \
        {"weights.pth": (None, 1 << 20)}  # a record from before sizes (or a size that is none): bounded only


def test_the_record_and_whose_copy_it_is():
    record = parse_record(json.dumps({"from": "/share/base", "kind": "minimind", "sha256": "a" * 64}).encode())
    assert copy_of(record, "/share/base", {"kind": "minimind", "sha256": "a" * 64})
    assert not copy_of(record, "/share/other", {"kind": "minimind", "sha256": "a" * 64})
    assert not copy_of(record, "/share/base", {"kind": "minimind", "sha256": "b" * 64})
    with pytest.raises(Unreadable, match="not an object|a list"):
        parse_record(b"[]")
