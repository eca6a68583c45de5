"""hostile audit 8 F4: another user's MiniMind-LoRA-looking .pth whose lora.A/B tensors have a size of (10**5000, 64)
crashed `run --check`'s init probe (minimind_lora's f-string: over Python's 4,300 digits), which printed the thread's
traceback, then "OK", then "init.from ... did not answer within 5 s (stalled): the run waits for it". Now the .pth
reader bounds a tensor's size (pth_shapes.MAX_DIMS, MAX_ELEMENTS): such a file is one it does not read, said once
as a note; and a probe that raises anything but an OSError is said as what it raised (bounded.Raised): `run --check`
refuses, naming init.from and the error, with no traceback, no "OK" and no "stalled". The .pth is made torch-free
(a pickler of our own), as the audit's was."""
from __future__ import annotations

import io
import pickle
import zipfile

import pytest
from typer.testing import CliRunner

from minilmd import bounded, probes
from minilmd.bounded import Raised, bounded_probe
from minilmd.cli import app
from minilmd.init_pth import minimind_lora_file
from minilmd.pth_shapes import NotReadHere, pth_shapes
from trainer_corpus import TINY_MODEL, write_config

BIG = 10 ** 5000


def _global(module: str, name: str) -> bytes:
    """A GLOBAL opcode: how torch's pickle names a function or class by reference (never imported here)."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _handmade(state: dict[str, tuple]) -> bytes:
    """A data.pkl as torch.save writes one, opcode by opcode (protocol 2): {name: _rebuild_tensor_v2(storage, 0,
    size, stride, False, {})}, each storage a persistent id ("storage", torch.HalfStorage, "0", "cpu", 1)."""
    ops = [b"\x80\x02}"]  # PROTO 2, EMPTY_DICT
    for name, size in state.items():
        ops.append(pickle.dumps(name, protocol=2)[2:-1])  # the key: its opcodes without PROTO and STOP
        ops.append(_global("torch._utils", "_rebuild_tensor_v2"))
        ops.append(b"(")  # MARK
        ops.append(b"(X\x07\x00\x00\x00storage" + _global("torch", "HalfStorage")
                   + b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01tQ")  # a tuple persistent id, BINPERSID
        ops.append(b"K\x00")  # storage_offset
        ops.append(pickle.dumps(tuple(size), protocol=2)[2:-1])
        ops.append(pickle.dumps((1,) * len(size), protocol=2)[2:-1])
        ops.append(b"\x89")  # NEWFALSE
        ops.append(b"}")  # backward hooks: an empty dict
        ops.append(b"tR")  # TUPLE, REDUCE
        ops.append(b"s")  # SETITEM
    ops.append(b".")
    return b"".join(ops)


def _pth(path, sizes: dict[str, tuple]) -> str:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("archive/data.pkl", _handmade(sizes))
        z.writestr("archive/version", "3\n")
    path.write_bytes(out.getvalue())
    return str(path)


def _lora(big: int) -> dict[str, tuple]:
    return {"model.layers.0.self_attn.q_proj.lora.A.weight": (big, 64),
            "model.layers.0.self_attn.q_proj.lora.B.weight": (64, big)}


def test_the_reader_bounds_a_tensors_size(tmp_path):
    with open(_pth(tmp_path / "ok.pth", _lora(16)), "rb") as f:
        assert pth_shapes(f) == _lora(16)
    for sizes in (_lora(BIG), _lora(1 << 40), {"w": (1 << 20, 1 << 20)}, {"w": (1,) * 9}):
        with open(_pth(tmp_path / "big.pth", sizes), "rb") as f, \
                pytest.raises(NotReadHere, match=r"a tensor's size is over what a model's tensor can be \(at most "
                                                 r"8 dimensions, under 2\*\*40 elements\)"):
            pth_shapes(f)
    assert minimind_lora_file(tmp_path / "big.pth") == ""  # `sample --lora`'s look: no error out of it either
    assert "a MiniMind LoRA adapter" in minimind_lora_file(tmp_path / "ok.pth")


def _check(config):
    result = CliRunner().invoke(app, ["run", "--check", str(config)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def test_check_notes_a_pth_of_a_huge_size_once_with_no_traceback_and_no_stall(tmp_path, corpus, capfd):
    pth = _pth(tmp_path / "lora_big_64.pth", _lora(BIG))
    code, said = _check(write_config(tmp_path, corpus, name="vb", init={"from": pth}, model=TINY_MODEL))
    err = capfd.readouterr().err
    assert "Traceback" not in said + err and "stalled" not in said and "waits" not in said, said + err
    assert f"note: init.from = {pth!r}: its tensors' shapes are not checked here: not a plain state dict: a " \
           f"tensor's size is over what a model's tensor can be" in said, said


def test_a_probe_that_raises_is_said_as_what_it_raised_never_a_stall(capfd):
    def fails():
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    answered, found, why = bounded_probe(fails, timeout_s=600)
    assert (answered, found) == (False, None) and isinstance(why, Raised)
    assert why == "failed (ValueError: Exceeds the limit (4300 digits) for integer string conversion)"
    assert "Traceback" not in capfd.readouterr().err
    assert bounded_probe(lambda: 1)[:2] == (True, 1)
    assert bounded.shared_storage_check(lambda: ["a problem"]) == ["a problem"]


def test_a_raise_a_daemon_caller_drops_is_said_in_one_line_never_silent(tmp_path, capfd, monkeypatch):
    """rundirwatch's room note, one of the daemon's callers that take any failure as no answer and drop `why`
    (review10b F2): a look that raises (a bug) was a silent "not answered"; now one line on stderr names the look and
    the error, no traceback. A caller that says `why` itself (says_why) gets no second line."""
    from minilmd.daemon.phases import rundirwatch

    def raises(path):
        raise ValueError("a bug in the look")

    monkeypatch.setattr(rundirwatch, "_free_bytes", raises)
    assert rundirwatch.room_note(tmp_path) is None  # still no answer: the note is left unsaid
    err = capfd.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert "minilmd: a look at shared storage (" in err and "raises) failed (ValueError: a bug in the look)" in err
    assert bounded_probe(raises, tmp_path, says_why=True)[2] == "failed (ValueError: a bug in the look)"
    assert capfd.readouterr().err == ""


def test_check_refuses_an_init_from_whose_probe_raises_naming_it_and_the_error(tmp_path, corpus, capfd,
                                                                             monkeypatch):
    """Any exception of the init probe (a reader's bug a hostile file reaches): before, a traceback, "OK", then
    "stalled ... the run waits for it". The fake raises as minimind_lora's f-string did."""
    pth = _pth(tmp_path / "lora_vic_64.pth", _lora(16))

    def raises(*args, **kwargs):
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    monkeypatch.setattr(probes, "model_problems", raises)
    code, said = _check(write_config(tmp_path, corpus, name="vb", init={"from": pth}, model=TINY_MODEL))
    err = capfd.readouterr().err
    assert code != 0 and "OK (run" not in said and "stalled" not in said and "Traceback" not in said + err, said
    assert f"init.from = {pth!r}: cannot be checked: failed (ValueError: Exceeds the limit (4300 digits) for " \
           f"integer string conversion)" in said, said
