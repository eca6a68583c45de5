"""The attacks on shared places that the "Shared places" table of docs/failure-modes.md names and no other test
reproduces: a corpus from elsewhere (its meta.json, a file it lists), another user's checkpoint named by init.from
(its manifest), a checkpoint or corpus listing a FIFO or a link to /dev/zero with a size that matches, and another
user's GPU lease whose body is 60 KB of `[`. Each was reproduced on the code before it: a hang, a RecursionError
or a MemoryError; each is now the place's defined failure.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from minilmd.checkpoint import FORMAT, REQUIRED_FILES, VERSION, CheckpointInvalid, validate
from minilmd.corpus.format import verify_prepared
from minilmd.corpus_meta import CorpusError, parse_meta, read_meta
from minilmd.daemon.jobs.initstage import stage_init
from minilmd.daemon.jobs.staging import SourceInvalid, stage
from minilmd.init_source import InitSource, InitSourceError, fingerprint
from minilmd.names import MANIFEST
from second_user import shared  # noqa: F401 - a fixture
from waiting import without_blocking

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
DEEP = b"[" * 60_000
PREPARED = {"format": "minilmd-prepared", "version": 1, "vocab_size": 8,
            "special_ids": {"pad": 0, "bos": 1, "eos": 2}, "splits": {}}


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _deep(path: Path) -> None:
    path.write_bytes(DEEP)


HOSTILE = {"a FIFO nobody writes": _fifo, "a link to /dev/zero": _zero, "60 KB of [": _deep}


def _checkpoint_listing(d: Path, odd: str, make: Callable[[Path], None]) -> Path:
    """A checkpoint whose manifest lists `odd` with size 0 and the empty file's sha256 (every size then matches,
    so the hashes are computed), `odd` made by `make`."""
    d.mkdir()
    files = {odd: {"size": 0, "sha256": EMPTY_SHA256}}
    for name in REQUIRED_FILES:
        (d / name).write_bytes(b"x")
        files[name] = {"size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}
    (d / MANIFEST).write_text(json.dumps({"format": FORMAT, "version": VERSION, "step": 1, "files": files}))
    make(d / odd)
    return d


@pytest.mark.parametrize("kind", ["a FIFO nobody writes", "a link to /dev/zero"])
def test_a_checkpoint_listing_a_fifo_or_dev_zero_is_invalid_without_being_read(tmp_path, kind):
    ckpt = _checkpoint_listing(tmp_path / "step_00000001", "extra", HOSTILE[kind])
    with pytest.raises(CheckpointInvalid) as e:
        without_blocking(lambda: validate(ckpt), ckpt / "extra")
    assert "not a regular file" in str(e.value)


@pytest.mark.parametrize("kind", ["a FIFO nobody writes", "a link to /dev/zero"])
def test_a_prepared_corpus_listing_a_fifo_or_dev_zero_fails_verification_without_being_read(tmp_path, kind):
    root = tmp_path / "prepared"
    (root / "train").mkdir(parents=True)
    listed = {"train/tokens.bin": {"size": 0, "sha256": EMPTY_SHA256}}
    (root / "meta.json").write_text(json.dumps({**PREPARED, "files": listed}))
    HOSTILE[kind](root / "train/tokens.bin")
    problems = without_blocking(lambda: verify_prepared(root), root / "train/tokens.bin")
    assert any("not a regular file" in p for p in problems), problems


def test_staging_refuses_a_listed_fifo_instead_of_waiting_on_it(tmp_path):
    source = tmp_path / "nfs" / "prepared"
    (source / "train").mkdir(parents=True)
    (source / "meta.json").write_text(json.dumps(
        {**PREPARED, "files": {"train/tokens.bin": {"size": 4096, "sha256": EMPTY_SHA256}}}))
    os.mkfifo(source / "train/tokens.bin")
    with pytest.raises(SourceInvalid, match="a FIFO, not a regular file"):
        without_blocking(lambda: stage(str(source), tmp_path / "shm", retries=0), source / "train/tokens.bin")


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_corpus_meta_json_from_elsewhere_is_a_corpus_error_or_an_invalid_source(tmp_path, kind):
    source = tmp_path / "nfs" / "prepared"
    source.mkdir(parents=True)
    HOSTILE[kind](source / "meta.json")
    with pytest.raises(CorpusError):
        without_blocking(lambda: read_meta(source), source / "meta.json")
    with pytest.raises(SourceInvalid):
        without_blocking(lambda: stage(str(source), tmp_path / "shm", retries=0), source / "meta.json")
    with pytest.raises(CorpusError, match="nested deeper"):
        parse_meta(DEEP, "elsewhere/meta.json")  # as fetched from an fsspec URL


@pytest.mark.parametrize("kind", ["a FIFO nobody writes", "a link to /dev/zero"])
def test_init_from_a_checkpoint_listing_a_fifo_or_dev_zero_is_refused_without_being_copied(tmp_path, kind):
    """Staging init.from copied every listed file with a plain open(): a FIFO in another user's checkpoint
    blocked the staging for ever."""
    ckpt = _checkpoint_listing(tmp_path / "step-00000001", "extra", HOSTILE[kind])
    with pytest.raises(SourceInvalid, match="extra is (a FIFO: not read|a symbolic link: not followed)"):
        without_blocking(lambda: stage_init(str(ckpt), tmp_path / "shm"), ckpt / "extra")


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_init_from_a_checkpoint_whose_manifest_is_hostile_is_refused_without_a_hang(tmp_path, kind):
    ckpt = tmp_path / "theirs" / "step_00000001"
    ckpt.mkdir(parents=True)
    HOSTILE[kind](ckpt / MANIFEST)
    with pytest.raises(InitSourceError, match="unreadable"):
        without_blocking(lambda: fingerprint(InitSource("checkpoint", ckpt)), ckpt / MANIFEST)
    with pytest.raises((SourceInvalid, InitSourceError)):  # final either way: not a checkpoint, or unreadable
        without_blocking(lambda: stage_init(str(ckpt), tmp_path / "shm"), ckpt / MANIFEST)


@pytest.mark.root
def test_another_users_lease_whose_body_is_deep_json_is_described_not_a_crash(shared):
    from lease_helpers import LEASE, admin_lock_dir, admission, first_line, nobody_running
    from second_user import sh_as_user

    locks = admin_lock_dir(shared)
    with nobody_running(locks, "nobody-run", hold=True) as holder:  # nobody leases the device, and holds its flock
        assert first_line(holder) == "leased"
        sh_as_user(f"head -c 60000 /dev/zero | tr '\\0' '[' > locks/{LEASE}", shared)
        assert (locks / LEASE).read_bytes() == DEEP  # his own file: he may write what he likes
        adm = admission(locks, "root-run")
        assert adm.try_acquire(1) is None  # leased by him: never taken, the body is not a crash
        assert f"pid {holder.pid}" in adm.last_report.summary()


class _RunsCode:
    """What a hostile .pth pickles: unpickling it would call os.mkdir(marker)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_init_from_a_pth_that_pickles_code_is_refused_and_runs_none_of_it(tmp_path):
    import torch

    from minilmd.config import ConfigError, RunConfig
    from minilmd.trainer.checkpoint.init_weights import load_init

    marker = tmp_path / "it-ran"
    torch.save({"model.embed_tokens.weight": _RunsCode(str(marker))}, tmp_path / "theirs.pth")
    cfg = RunConfig(source="test")
    cfg.init.from_ = str(tmp_path / "theirs.pth")
    with pytest.raises(ConfigError, match="not a loadable state dict"):
        load_init(cfg)  # torch.load(weights_only=True): no code of the file runs
    assert not marker.exists()
