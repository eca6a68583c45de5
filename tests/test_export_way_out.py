"""An export's every way out: its temporary `.NAME.tmp` beside --out is this process's own, made by it and removed
again whether the export fails on a bug, is interrupted (Ctrl-C) or stopped (SIGTERM); an --out there before is
left as it was; a `.NAME.tmp` that is not this export's is never reused nor removed."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minilmd.cli import app
from waiting import wait_until
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer

torch.set_num_threads(1)
PAUSED = Path(__file__).resolve().parent / "export_paused.py"
EARLIER = b"an earlier export, not to be harmed\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("way-out")
    return save_checkpoint(root / "ckpt", tiny_model(seed=3), step=1, tokenizer=train_tokenizer(root / "tok.json"))


def _earlier_out(tmp_path: Path, fmt: str) -> Path:
    """--out as an earlier export left it: a .pth, or the empty directory an hf export may fill."""
    out = tmp_path / "out" / ("m.pth" if fmt == "minimind" else "hf")
    out.parent.mkdir()
    if fmt == "minimind":
        out.write_bytes(EARLIER)
    else:
        out.mkdir()
    return out


@pytest.mark.slow  # a `minilmd export` child each
@pytest.mark.parametrize("fmt", ["minimind", "hf"])
@pytest.mark.parametrize("way_out", ["a bug", "SIGINT", "SIGTERM"])
def test_an_export_stopped_while_writing_leaves_no_temporary_copy_and_out_as_it_was(checkpoint, tmp_path, fmt,
                                                                                    way_out):
    """A real `minilmd export` child stopped after it wrote its files into `.NAME.tmp`, before the rename: before,
    an exception that was no write error, Ctrl-C ("Aborted!") and SIGTERM (killed) all left the half export beside
    --out. Now it is removed on each (130 for the signals), and the earlier --out is untouched."""
    out = _earlier_out(tmp_path, fmt)
    ready = tmp_path / "ready"
    mode = "raise" if way_out == "a bug" else "wait"
    with open(tmp_path / "stderr", "wb") as err:
        child = subprocess.Popen([sys.executable, str(PAUSED), mode, str(ready), "export", str(checkpoint),
                                  "--format", fmt, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=err)
    try:
        if mode == "wait":
            wait_until(lambda: ready.exists() or child.poll() is not None, 300, "the export to write its files")
            assert child.poll() is None, (tmp_path / "stderr").read_text()
            child.send_signal(signal.SIGINT if way_out == "SIGINT" else signal.SIGTERM)
        code = child.wait(300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    said = (tmp_path / "stderr").read_text()
    assert [p.name for p in out.parent.iterdir()] == [out.name], (code, said)  # no .NAME.tmp
    if mode == "wait":
        assert code == 130 and "minilmd export: interrupted; nothing half-written is left" in said, (code, said)
    else:
        assert code == 1 and "LookupError: a bug after the files were written" in said, (code, said)
    if fmt == "minimind":
        assert out.read_bytes() == EARLIER
    else:
        assert out.is_dir() and not any(out.iterdir())


@pytest.mark.parametrize("fmt", ["minimind", "hf"])
def test_a_temporary_name_already_taken_is_refused_and_left_alone(checkpoint, tmp_path, fmt):
    """`.NAME.tmp` there already is another export's (writing now, or killed): before, hf removed it and minimind
    wrote through it. Now exit 2 naming it, and it and --out stay as they were."""
    out = _earlier_out(tmp_path, fmt)
    theirs = out.with_name(f".{out.name}.tmp")
    theirs.write_bytes(b"another export's\n")
    result = CliRunner().invoke(app, ["export", str(checkpoint), "--format", fmt, "--out", str(out)])
    assert result.exit_code == 2 and not isinstance(result.exception, Exception), (result.output, result.exception)
    assert f"minilmd export: {theirs}: exists: another export to {out} is writing it" in result.output
    assert theirs.read_bytes() == b"another export's\n"
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([out.name, theirs.name])
    if fmt == "minimind":
        assert out.read_bytes() == EARLIER
    else:
        assert not any(out.iterdir())
