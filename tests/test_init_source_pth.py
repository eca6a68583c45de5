"""A MiniMind .pth named by init.from is another user's or another run's file (often on NFS): read as untrusted.

Reproduced on the code before: `fingerprint` hashed it with a plain open() (a FIFO blocked it, a link was followed,
a sparse terabyte was read to its end) and `_pth_weights` loaded the path again with torch.load after an is_file()
check (a link followed; what was loaded need not be what was hashed). Now it is opened once (no link, no block),
bounded by the run's model (model_shapes.pth_bound), and hashed and unpickled from that one read.
"""
from __future__ import annotations

import hashlib
import os

import pytest
import torch

from init_from_helpers import _config, _pth
from minilmd.config import ConfigError
from minilmd.daemon.jobs.initstage import stage_init
from minilmd.daemon.jobs.staging import SourceInvalid
from minilmd.init_source import InitSource, InitSourceError, fingerprint, resolve
from minilmd.trainer.checkpoint import init_weights
from waiting import without_blocking

TERABYTE = 1 << 40


def _swapped_after_resolve(monkeypatch, make):
    """init_weights' resolve as it is, then the .pth it found replaced by make(path): another user's swap between
    the look and the read."""
    def resolve_then_swap(spec, checkpoint="best"):
        source = resolve(spec, checkpoint)
        source.path.unlink()
        make(source.path)
        return source

    monkeypatch.setattr(init_weights, "resolve", resolve_then_swap)


@pytest.mark.parametrize("swap", ["a FIFO", "a symbolic link"])
def test_a_pth_swapped_for_a_fifo_or_a_link_after_its_check_is_refused_without_blocking(tmp_path, monkeypatch,
                                                                                        swap):
    cfg = _config(tmp_path / "theirs.pth")
    _pth(tmp_path / "theirs.pth", cfg)
    elsewhere = _pth(tmp_path / "elsewhere.pth", cfg, fill=0.25)
    _swapped_after_resolve(monkeypatch, os.mkfifo if swap == "a FIFO" else lambda p: p.symlink_to(elsewhere))
    with pytest.raises(ConfigError, match=f"theirs.pth is {swap}"):
        without_blocking(lambda: init_weights.load_init(cfg), tmp_path / "theirs.pth")


def test_a_pth_that_is_a_link_to_a_regular_file_is_refused_not_followed(tmp_path):
    cfg = _config(tmp_path / "link.pth")
    (tmp_path / "link.pth").symlink_to(_pth(tmp_path / "real.pth", cfg))
    with pytest.raises(ConfigError, match="link.pth is a symbolic link: not followed"):
        init_weights.load_init(cfg)


def test_a_sparse_terabyte_pth_is_refused_by_its_size_before_a_byte_is_read(tmp_path):
    cfg = _config(tmp_path / "huge.pth")
    with open(tmp_path / "huge.pth", "wb") as f:
        f.truncate(TERABYTE)  # sparse: no disk used, but hashed to its end it would take an hour
    # Staging, which does not pass the model, reads no .pth beyond MAX_PTH_BYTES: a final refusal, not an hour.
    with pytest.raises(SourceInvalid, match=r"over 16 GiB, more than init.from's .pth may be"):
        without_blocking(lambda: stage_init(str(tmp_path / "huge.pth"), tmp_path / "shm"))
    source = InitSource("minimind", tmp_path / "huge.pth")
    with pytest.raises(InitSourceError, match=r"over .* more than a state dict of this run's model can be"):
        without_blocking(lambda: fingerprint(source, cfg.model_dict()))
    with pytest.raises(ConfigError, match="more than a state dict"):
        without_blocking(lambda: init_weights.load_init(cfg))


def test_what_is_loaded_is_what_was_hashed(tmp_path, monkeypatch):
    """The file replaced by other weights right after torch.load: the record still names the weights loaded (the
    code before hashed the path again after loading it, and recorded the other file's sha256)."""
    cfg = _config(tmp_path / "theirs.pth")
    theirs = _pth(tmp_path / "theirs.pth", cfg, fill=0.5)
    first = hashlib.sha256(theirs.read_bytes()).hexdigest()
    real_load = torch.load

    def load_then_swap(*args, **kwargs):
        state = real_load(*args, **kwargs)
        _pth(tmp_path / "other.pth", cfg, fill=0.75).replace(theirs)
        return state

    monkeypatch.setattr(torch, "load", load_then_swap)
    weights, record = init_weights.load_init(cfg)
    assert float(weights["model.norm.weight"][0]) == 0.5
    assert record["sha256"] == first != hashlib.sha256(theirs.read_bytes()).hexdigest()


def test_a_pth_gone_is_unreachable_for_staging_and_a_refusal_for_the_trainer(tmp_path):
    """Missing when read (its share gone after the look): the OSError staging waits for, as before."""
    source = InitSource("minimind", tmp_path / "gone.pth")
    with pytest.raises(FileNotFoundError):
        fingerprint(source)
    with pytest.raises(InitSourceError):  # and a directory where the .pth was: final
        (tmp_path / "dir.pth").mkdir()
        fingerprint(InitSource("minimind", tmp_path / "dir.pth"))
