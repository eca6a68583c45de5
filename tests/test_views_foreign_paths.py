"""Root's `minilmd status --all`, `status RUN` and `stop RUN` of another user's run whose state.json names paths on
storage that never answers (an autofs or FUSE path its user chose: his scratch, his claimed run directory).

Before, each of these commands looked at state.json's checkpoint path (the newest checkpoint beside it, its
manifest) and its run directory claim with a plain stat or listing: `status RUN` and `stop` blocked for as long as the
storage stalled, and `status --all` showed that user's whole row as "unreadable (no answer within 5 s)", saying
nothing of which path stalled. Now each such look is bounded (daemon/views/pathlooks.py), and the path that did not
answer is said. The stall is released only once the command has answered: no timing is asserted.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults_fixtures import faultfs  # noqa: F401  (the fixture)
from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.fsio import atomic_write_json
from second_user import second_user, shared, user_python  # noqa: F401  (shared: the fixture)
from waiting import wait_until

REGISTER = ("import sys\nfrom minilmd.daemon.host import registry\n"
            "registry.register(sys.argv[1], sys.argv[2], 'x.toml')\n")


RUN_TOML = """[run]
name = "n-run"
dir = "{run_dir}"
scratch = "{stalled}/scratch"
remote = "{stalled}/remote"
[data]
prepared = "{stalled}/corpus"
[train]
max_steps = 100
"""
STALLED = ("scratch*", "claimed-run*", "remote*", "corpus*")


def planted_run(shared: Path, stalled: Path) -> Path:
    """nobody's run directory, its supervisor gone, whose state.json names a checkpoint in `stalled` (scratch on the
    stalling mount), one synced to run.remote there, and claims a run directory there too; its run.toml names that
    scratch, that run.remote and a corpus there."""
    uid, gid = second_user()
    run_dir = shared / "n-run"
    run_dir.mkdir()
    body = new_state("n-run", stalled / "claimed-run", "x.toml")
    t = time.time()
    step = stalled / "scratch" / names.CHECKPOINTS / names.step_name(10)
    body["supervisor"].update(pid=2 ** 22 + 7, start_ticks=1)  # gone
    body.update(phase="training", progress={"step": 10, "total_steps": 100, "loss": 3.0},
                local_checkpoint={"step": 10, "time": t, "path": str(step)},
                remote_checkpoint={"step": 10, "time": t, "verified": True,
                                   "path": str(stalled / "remote" / names.step_name(10))},
                sync={"state": "ok", "last_ok": t})
    atomic_write_json(run_dir / names.STATE, body)
    (run_dir / names.RUN_CONFIG_COPY).write_text(RUN_TOML.format(run_dir=run_dir, stalled=stalled))
    for path in (run_dir, run_dir / names.STATE, run_dir / names.RUN_CONFIG_COPY):
        os.chown(path, uid, gid)
    (run_dir / names.STATE).chmod(0o644)
    return run_dir


def answered_while_stalled(argv: list[str], env: dict, out: Path, faultfs, said: str) -> str:
    """The output of the command, once it has said `said` while the storage still stalls; then the stall released."""
    with open(out, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "minilmd.cli", *argv], env=env, stdout=sink,
                                stderr=subprocess.STDOUT, cwd="/")
    try:
        wait_until(lambda: said in out.read_text(), 120, f"{argv} to answer while the storage stalls")
        assert faultfs.hits("stall"), "the stall never fired: the test proves nothing"
    finally:
        faultfs.clear()
        proc.wait(120)
    return out.read_text()


@pytest.mark.root
@pytest.mark.slow  # three commands, each waiting out its bounded looks
def test_status_and_stop_of_another_users_run_naming_a_stalled_path_answer_and_say_it(shared, faultfs, tmp_path):
    stalled = faultfs.root
    (faultfs.backing / "scratch" / names.CHECKPOINTS / names.step_name(10)).mkdir(parents=True)
    for made in ("claimed-run", f"remote/{names.step_name(10)}", "corpus"):
        (faultfs.backing / made).mkdir(parents=True)
    run_dir = planted_run(shared, stalled)
    system = shared / "system"
    system.mkdir()
    system.chmod(0o1777)
    env = {**os.environ, names.SYSTEM_REGISTRY_ENV: str(system)}
    theirs = {**env, "XDG_STATE_HOME": str(shared / "nobody-state")}
    done = subprocess.run(user_python(REGISTER, "n-run", str(run_dir)), capture_output=True, text=True, cwd="/",
                          timeout=60, env=theirs)
    assert done.returncode == 0, done.stderr
    env["XDG_STATE_HOME"] = str(tmp_path / "root-state")
    for glob in STALLED:
        faultfs.stall(glob, 600, op="*")

    table = answered_while_stalled(["status", "--all"], env, tmp_path / "all.txt", faultfs, "did not answer")
    row = next(line for line in table.splitlines() if line.startswith("n-run "))
    assert "training (not running)" in row and "10/100" in row, table  # the row itself, not "unreadable"
    assert f"n-run: scratch {stalled}/scratch did not answer within" in table, table

    for glob in STALLED:
        faultfs.stall(glob, 600, op="*")
    shown = answered_while_stalled(["status", str(run_dir)], env, tmp_path / "one.txt", faultfs, "did not answer")
    assert "step 10/100" in shown and f"{stalled}/scratch" in shown, shown
    assert f"{stalled}/claimed-run" in shown and "did not answer within" in shown, shown
    assert f"run.remote {stalled}/remote did not answer within" in shown, shown  # run.toml's paths too
    assert f"data.prepared {stalled}/corpus did not answer within" in shown, shown

    for glob in ("scratch*", "remote*"):
        faultfs.stall(glob, 600, op="*")
    stopped = answered_while_stalled(["stop", str(run_dir)], env, tmp_path / "stop.txt", faultfs,
                                     f"run.remote {stalled}/remote did not answer within")  # said too (before: not)
    assert f"{stalled}/scratch" in stopped, stopped
