"""`export` and places another user owns (audit hostile4 F1's second defect, F4(b)):

- a checkpoint place the export may not read (a run.remote whose owner, another user, made it 0700): on main a raw
  Rich traceback ending in PermissionError, exit 1. Now one line, exit 74 (EX_IOERR, as any read or write that
  failed), saying whose that place is and that nothing was written;
- an hf --out directory another user made first: on main, in a sticky directory, "Operation not permitted ...
  choose an --out you may write" without whose it is (as root, his directory was replaced and deleted). Now refused
  before anything is written (exit 2), naming its owner.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minilmd.cli import app
from second_user import as_teammate, shared, user_python  # noqa: F401 - shared: a fixture
from weights_helpers import export_checkpoint

torch.set_num_threads(1)
CLI = "import sys\nfrom minilmd.cli import main\nsys.argv = ['minilmd', *sys.argv[1:]]\nmain()\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return export_checkpoint(tmp_path_factory.mktemp("foreign-places"), seed=7)


@pytest.mark.slow  # a `minilmd export` child as the second user
def test_an_export_that_may_not_read_the_checkpoint_says_whose_place_it_is_in_one_line(checkpoint, shared):
    remote = shutil.copytree(checkpoint, shared / "remote")  # the run's checkpoints, in a place of root's
    subprocess.run(["chmod", "-R", "a+rX", str(remote)], check=True)
    remote.chmod(0o700)  # its owner took them away
    out = shared / "m.pth"
    done = subprocess.run(user_python(CLI, "export", str(remote), "--format", "minimind", "--out", str(out)),
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert done.returncode == 74, done.stdout + done.stderr  # main: 1, a traceback
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"minilmd export: {remote}: the checkpoint could not be read: Permission denied" in done.stderr
    assert f"{remote} belongs to user root (uid 0)" in done.stderr and "nothing was written" in done.stderr
    assert not out.exists()


def test_an_hf_out_directory_another_user_made_first_is_refused_naming_him(checkpoint, shared):
    out = shared / "hfout"
    as_teammate(f"mkdir -m 777 {out}")
    result = CliRunner().invoke(app, ["export", str(checkpoint), "--format", "hf", "--out", str(out)])
    assert result.exit_code == 2 and not isinstance(result.exception, Exception), (result.output, result.exception)
    assert f"{out}: a directory of user nobody" in result.output, result.output  # main: 0, his directory replaced
    assert "choose a new --out, or have its owner remove it" in result.output
    assert os.lstat(out).st_uid != 0 and os.listdir(out) == []  # his, as it was
    assert [p.name for p in shared.iterdir()] == ["hfout"]  # no temporary copy left beside it
