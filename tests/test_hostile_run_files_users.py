"""Another user's run files, with two real Unix users (root and nobody, through setpriv; a third uid without an
account where a file must be someone else's): `minilmd status` of a run whose state.json one may not read was a
PermissionError traceback; `init.from` naming another user's run whose state.json is a FIFO or a link to /dev/zero
hung `run --check` and `run` (or ended in MemoryError). Now: "unreadable (why)", and a predecessor whose state.json
cannot be read is waited for (it may become readable; its owner fixes it), never a hang.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hostile_files_helpers import make_hostile, minilmd
from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.fsio import atomic_write_json
from second_user import second_user, shared_dir, user_python
from supervisor_helpers import cli, start_supervisor, state, write_config
from waiting import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]  # real users, real CLI processes

THIRD_UID = 54321
STATUS = "import sys; sys.argv[0] = 'minilmd'; from minilmd.cli import main; main()"


@pytest.fixture
def shared():
    path = shared_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_status_of_a_state_json_one_may_not_read(shared):
    second_user()
    run_dir = shared / "root-run"
    run_dir.mkdir()
    run_dir.chmod(0o755)
    atomic_write_json(run_dir / names.STATE, new_state("root-run", run_dir, "x.toml"))
    (run_dir / names.STATE).chmod(0o600)
    done = subprocess.run(user_python(STATUS, "status", str(run_dir)), capture_output=True, text=True, cwd="/",
                          timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done
    assert "state.json unreadable (permission denied)" in done.stdout, done


def test_roots_status_of_a_users_run_with_a_state_json_of_a_third_uid(shared):
    uid, gid = second_user()
    run_dir = shared / "her-run"
    run_dir.mkdir()
    atomic_write_json(run_dir / names.STATE, new_state("her-run", run_dir, "x.toml"))
    os.chown(run_dir, uid, gid)
    os.chown(run_dir / names.STATE, THIRD_UID, THIRD_UID)
    shown = minilmd("status", str(run_dir))
    assert shown.returncode == 0 and f"state.json unreadable (owned by uid {THIRD_UID})" in shown.stdout, shown


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_init_from_another_users_run_whose_state_json_is_hostile(tmp_path, corpus, shared, kind):
    uid, gid = second_user()
    before = write_config(tmp_path, corpus, name="hers", remote=False, run={"dir": str(shared / "hers")})
    pred_dir = load_config(before).run_dir
    pred_dir.mkdir()
    make_hostile(pred_dir / names.STATE, kind)
    for path in (pred_dir, pred_dir / names.STATE):
        os.chown(path, uid, gid, follow_symlinks=False)
    after = write_config(tmp_path, corpus, name="mine", init={"from": str(before)})

    checked = cli("run", "--check", str(after), timeout=120)
    assert checked.returncode == 0 and "Traceback" not in checked.stderr, checked

    proc = start_supervisor(after, tmp_path / "mine.out")
    try:
        run_dir = load_config(after).run_dir
        waiting = wait_until(lambda: (state(run_dir).get("init_wait") or {}).get("why"), timeout=120,
                             what="the wait for init.from")
        assert state(run_dir)["phase"] == "waiting_init", state(run_dir)
        why = {"fifo": "a FIFO", "zero": "a symbolic link"}[kind]
        assert waiting == f"run hers's state.json is unreadable ({why})", waiting
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    assert "Traceback" not in (tmp_path / "mine.out").read_text()


def test_predecessor_state_json_of_a_third_uid_is_not_trusted(tmp_path, corpus, shared):
    """A finished-looking state.json planted in her run directory by someone else does not start this run."""
    uid, gid = second_user()
    before = write_config(tmp_path, corpus, name="hers", remote=False, run={"dir": str(shared / "hers")})
    pred_dir = load_config(before).run_dir
    pred_dir.mkdir()
    body = new_state("hers", pred_dir, str(before))
    body.update(phase="done", outcome={"exit": 0, "phase": "done", "time": 1.0, "reason": "finished"})
    atomic_write_json(pred_dir / names.STATE, body)
    os.chown(pred_dir, uid, gid)
    os.chown(pred_dir / names.STATE, THIRD_UID, THIRD_UID)
    done = subprocess.run([sys.executable, "-c", "import sys; from minilmd.init_source import predecessor, "
                           "predecessor_outcome; print(predecessor_outcome(predecessor(sys.argv[1])))", str(before)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done
    assert f"('waiting', \"run hers's state.json is unreadable (owned by uid {THIRD_UID})\")" in done.stdout, done
    assert Path(pred_dir / names.STATE).stat().st_uid == THIRD_UID
