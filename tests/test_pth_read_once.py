"""`run --check` reads an init.from .pth once (minilmd/init_pth.py pth_shapes_of): it asked twice, for its problems
(pth_problems: another model's tensors) and for its note (pth_note: a .pth it does not read), and each time the
.pth, maybe gigabytes on NFS, was read and its data.pkl unpickled again. The reader (minilmd/pth_shapes.py
pth_shapes) is wrapped to count its reads: one per --check, for a .pth it reads and for one it does not; a .pth
changed since is read again, never answered from what an older one held."""
from __future__ import annotations

import pytest

from minilmd import pth_shapes as pth_shapes_module
from test_check_pth_shapes import NOT_CHECKED, _check, _hostile, _minimind_pth, _source_model, _stage
from trainer_corpus import TINY_MODEL


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The .pth files the shapes reader read, one entry a read (init_pth imports it at each call)."""
    read, done = pth_shapes_module.pth_shapes, []

    def counted(f):
        done.append(f.name)
        return read(f)

    monkeypatch.setattr(pth_shapes_module, "pth_shapes", counted)
    return done


def test_check_reads_a_pth_it_reads_once(tmp_path, corpus, reads):
    pth = _minimind_pth(tmp_path / "pre.pth", _source_model(tmp_path, corpus))
    code, said = _check(_stage(tmp_path, corpus, pth, model=TINY_MODEL))
    assert code == 0 and NOT_CHECKED not in said, said
    assert len(reads) == 1, reads


def test_check_reads_a_pth_it_does_not_read_once_and_notes_it(tmp_path, corpus, reads):
    pth = _hostile("legacy", tmp_path, _source_model(tmp_path, corpus), tmp_path / "planted")
    code, said = _check(_stage(tmp_path, corpus, pth, model=TINY_MODEL))
    assert code == 0 and said.count(NOT_CHECKED) == 1, said
    assert len(reads) == 1, reads


def test_a_pth_changed_since_is_read_again(tmp_path, corpus, reads):
    model = _source_model(tmp_path, corpus)
    pth = _minimind_pth(tmp_path / "hostile.pth", model)
    stage = _stage(tmp_path, corpus, pth, model=TINY_MODEL)
    assert _check(stage)[0] == 0 and len(reads) == 1, reads
    assert _hostile("legacy", tmp_path, model, tmp_path / "planted") == pth  # the same name, other contents
    code, said = _check(stage)
    assert code == 0 and said.count(NOT_CHECKED) == 1, said  # what it holds now, not the cached shapes
    assert len(reads) == 2, reads
