"""`run --check` compares an init.from .pth's tensor shapes with the run's [model] (minilmd/pth_shapes.py reads them
without torch; init_model.shapes_mismatch is the trainer's rule). It said nothing of a .pth of another model: the
trainer refused it at start, after the user had walked away. A .pth the reader does not read (torch's legacy format,
a pickle that is more than a state dict, a damaged zip, a data.pkl over its bound) is one note, never a traceback,
and nothing of it runs: it may be another user's file on a share. The .pth is read once per --check (pth_problems and
pth_note asked the reader each, reading and unpickling a .pth of gigabytes on NFS twice): the reader is wrapped to
count its reads; a .pth changed since is read again, never answered from what an older one held."""
from __future__ import annotations

import io
import pickle
import re
import traceback
import zipfile

import pytest
import torch
from typer.testing import CliRunner

from minilmd import pth_shapes as pth_shapes_module
from minilmd.cli import app
from minilmd.config import ConfigError, load_config
from minilmd.model_shapes import EMBED_KEY, TIED_HEAD_KEY, expected_state_shapes
from minilmd.protocol import SUPERVISOR_CONFIG
from minilmd.pth_shapes import MAX_PICKLE_BYTES, NotReadHere, pth_shapes
from trainer_corpus import TINY_MODEL, write_config

NOT_CHECKED = "its tensors' shapes are not checked here: "


def _check(config):
    result = CliRunner().invoke(app, ["run", "--check", str(config)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def _minimind_pth(path, model: dict):
    """A .pth as MiniMind's trainers save one: fp16 tensors of every weight, the tied head among them."""
    state = {k: torch.randn(shape) for k, shape in expected_state_shapes(model).items()}
    state[TIED_HEAD_KEY] = state[EMBED_KEY]
    torch.save({k: v.half() for k, v in state.items()}, path)
    return path


def _stage(tmp_path, corpus, source, **sections):
    return write_config(tmp_path, corpus, name="sft", init={"from": str(source)}, **sections)


def _source_model(tmp_path, corpus) -> dict:
    return load_config(write_config(tmp_path, corpus, name="pre")).model_dict()  # TINY_MODEL, the corpus's vocab


def test_check_refuses_a_pth_of_another_model_in_the_trainers_words(tmp_path, corpus):
    pth = _minimind_pth(tmp_path / "pre.pth", _source_model(tmp_path, corpus))
    stage = _stage(tmp_path, corpus, pth)
    text = re.sub(r"\[model\]\n(?:[a-z_]+ = .*\n)*", f"[model]\nvocab_size = {corpus[1]}\n", stage.read_text())
    stage.write_text(text)  # [model] left out but the corpus's vocabulary: the defaults (the docs' sft.toml)
    code, said = _check(stage)
    assert code == SUPERVISOR_CONFIG, said
    assert (f"init.from = {str(pth)!r}: its tensors' shapes are of another model config: model.hidden_size: source "
            f"64, run 768 (default)," in said), said
    assert "[model] is not inherited from init.from" in said and "\n      hidden_size = 64" in said, said
    from minilmd.trainer.checkpoint.init_weights import load_init

    with pytest.raises(ConfigError) as refused:
        load_init(load_config(stage))
    [trainer_said] = refused.value.problems
    assert " ".join(trainer_said.split()) in " ".join(said.split()), (trainer_said, said)  # the same words

    pasted = said.split("values in this config's [model]:\n", 1)[1].split("\n")[1:]
    lines = [line.strip() for line in pasted if re.match(r"^ {6}[a-z_]+ = ", line)]
    assert "hidden_size = 64" in lines and "num_hidden_layers = 2" in lines, said
    stage.write_text(stage.read_text().replace("[model]\n", "[model]\n" + "".join(f"{x}\n" for x in lines)))
    code, said = _check(stage)
    assert code == 0 and "another model config" not in said and NOT_CHECKED not in said, said


def test_check_passes_a_pth_of_this_model_with_nothing_to_say(tmp_path, corpus):
    pth = _minimind_pth(tmp_path / "pre.pth", _source_model(tmp_path, corpus))
    code, said = _check(_stage(tmp_path, corpus, pth, model=TINY_MODEL))
    assert code == 0 and "init.from" not in said.replace("init.from =", ""), said
    assert NOT_CHECKED not in said and "shapes" not in said, said


def test_check_refuses_a_pth_whose_head_is_not_its_embedding(tmp_path, corpus):
    model = _source_model(tmp_path, corpus)
    state = {k: torch.zeros(shape) for k, shape in expected_state_shapes(model).items()}
    state[TIED_HEAD_KEY] = torch.zeros(model["vocab_size"] + 1, model["hidden_size"])
    torch.save(state, tmp_path / "untied.pth")
    code, said = _check(_stage(tmp_path, corpus, tmp_path / "untied.pth", model=TINY_MODEL))
    assert code == SUPERVISOR_CONFIG and "lm_head.weight differs from model.embed_tokens.weight" in said, said


class _Runs:
    """A pickle that runs `fn(*args)` when unpickled by a plain pickle.load (what a torch.load without
    weights_only would do)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _zip_bytes(data_pkl: bytes, compress: int = zipfile.ZIP_STORED) -> bytes:
    """A zip laid out as torch.save's, holding `data_pkl` as its data.pkl."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compress) as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/version", "3\n")
    return out.getvalue()


def _zip_of(path, data_pkl: bytes, compress: int = zipfile.ZIP_STORED):
    path.write_bytes(_zip_bytes(data_pkl, compress))
    return path


def _hostile(kind: str, tmp_path, model: dict, planted):
    import os

    pth = tmp_path / "hostile.pth"
    if kind == "os.system":
        return _zip_of(pth, pickle.dumps({"w": _Runs(os.system, f"touch {planted}")}, protocol=2))
    if kind == "eval":
        return _zip_of(pth, pickle.dumps(_Runs(eval, f"open({str(planted)!r}, 'w')"), protocol=4))
    if kind == "zip bomb":  # a few KiB on disk, a data.pkl listed at 4 times the bound
        return _zip_of(pth, b"\0" * (4 * MAX_PICKLE_BYTES), zipfile.ZIP_DEFLATED)
    if kind == "not a zip":
        pth.write_bytes(b"hello, not a checkpoint\n" * 100)
        return pth
    _minimind_pth(pth, model)
    if kind == "truncated":
        pth.write_bytes(pth.read_bytes()[:pth.stat().st_size // 2])
    elif kind == "legacy":
        torch.save({k: torch.zeros(s) for k, s in expected_state_shapes(model).items()}, pth,
                   _use_new_zipfile_serialization=False)
    return pth


HOSTILE = {"os.system": "not a plain state dict: GLOBAL posix.system",
           "eval": "not a plain state dict: GLOBAL builtins.eval",
           "zip bomb": "its data.pkl is 4 MiB, over 1 MiB",
           "not a zip": "not a zip archive",
           "truncated": "not a zip archive, or one cut short or damaged",
           "legacy": "torch.save's legacy format (not a zip archive)"}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_check_notes_a_pth_it_does_not_read_and_runs_none_of_it(tmp_path, corpus, kind):
    planted = tmp_path / "planted"
    pth = _hostile(kind, tmp_path, _source_model(tmp_path, corpus), planted)
    code, said = _check(_stage(tmp_path, corpus, pth, model=TINY_MODEL))
    assert code == 0 and "Traceback" not in said, said
    notes = [line for line in said.splitlines() if NOT_CHECKED in line]
    assert len(notes) == 1 and notes[0].startswith(f"note: init.from = {str(pth)!r}: {NOT_CHECKED}"), said
    assert HOSTILE[kind] in notes[0] and notes[0].endswith("; the trainer checks them at start"), notes
    assert not planted.exists()
    with pytest.raises(NotReadHere):  # the reader alone: the same refusal, nothing run
        pth_shapes(io.BytesIO(pth.read_bytes()))
    assert not planted.exists()


def test_the_reader_says_what_torch_says_of_a_minimind_state_dict():
    from weights_helpers import tiny_model

    model = tiny_model(vocab_size=300)
    for state in (model.state_dict(), {k: v.half() for k, v in model.state_dict().items()},  # MiniMind's fp16
                  {k: torch.nn.Parameter(v.bfloat16()) for k, v in model.state_dict().items()}):
        saved = io.BytesIO()
        torch.save(state, saved)
        loaded = torch.load(io.BytesIO(saved.getvalue()), weights_only=True)
        assert pth_shapes(saved) == {k: tuple(v.shape) for k, v in loaded.items()}


@pytest.mark.parametrize("payload, refused", [
    (pickle.dumps({"a": _Runs(print, "ran")}), "GLOBAL builtins.print"),
    (b"\x80\x02}q\x00X\x01\x00\x00\x00aQ.", "a persistent id other than a storage"),  # a str persistent id
    (pickle.dumps([1, 2]), "not a dict of tensors by name"),
    (pickle.dumps({"a": 1}), "not a dict of tensors by name"),
    (b"\x80\x02(" * 1000, "not a readable pickle"),
])
def test_the_reader_refuses_what_is_no_plain_state_dict(tmp_path, payload, refused):
    with pytest.raises(NotReadHere, match=re.escape(refused)):
        pth_shapes(io.BytesIO(_zip_of(tmp_path / "x.pth", payload).read_bytes()))


def test_the_reader_inflates_nothing_and_bounds_the_members(monkeypatch):
    """A deflated data.pkl listed at 100 bytes that inflates to 16 MiB (zipfile inflates a member's stream whole:
    2 GiB of memory for a 1 MiB file of a gigabyte of zeros), and a zip of more members than the bound (made
    small here: the same rule)."""
    import struct

    liar = io.BytesIO()
    with zipfile.ZipFile(liar, "w", compression=zipfile.ZIP_DEFLATED) as z:  # one member: one central entry
        z.writestr("archive/data.pkl", b"\0" * (16 << 20))
    data = bytearray(liar.getvalue())
    struct.pack_into("<I", data, 22, 100)  # the local header's uncompressed size
    struct.pack_into("<I", data, data.rfind(b"PK\x01\x02") + 24, 100)  # the central directory's
    with pytest.raises(NotReadHere, match="its data.pkl is compressed"):
        pth_shapes(io.BytesIO(bytes(data)))

    from minilmd import pth_shapes as reader

    monkeypatch.setattr(reader, "MAX_MEMBERS", 10)
    many = io.BytesIO()
    with zipfile.ZipFile(many, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({}))
        for i in range(10):
            z.writestr(f"archive/data/{i}", b"")
    with pytest.raises(NotReadHere, match="a zip of over 10 members"):
        pth_shapes(many)
    assert pth_shapes(io.BytesIO(_zip_bytes(pickle.dumps({})))) == {}  # 2 members: read


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


def test_a_pth_not_read_here_is_a_fresh_exception_at_each_ask(tmp_path):
    """Review 9b #9: the cache kept the NotReadHere it caught and raised that one instance again: each raise added
    its frames to the same traceback (3 asks, 6 frames) and kept their locals alive."""
    from minilmd.init_kinds import InitSource
    from minilmd.init_pth import pth_shapes_of

    pth = tmp_path / "legacy.pth"
    pth.write_bytes(b"\x80\x02not a zip" * 10)
    raised = []
    for _ in range(3):
        with pytest.raises(NotReadHere, match="not a zip archive") as caught:
            pth_shapes_of(InitSource("minimind", pth), {**TINY_MODEL, "vocab_size": 6400})
        raised.append(caught.value)
    assert len({id(e) for e in raised}) == 3 and len({str(e) for e in raised}) == 1, raised
    depths = [len(traceback.extract_tb(e.__traceback__)) for e in raised]
    assert depths[0] == depths[1] == depths[2], depths
