"""Another user's entries at a run's own names in a shared sticky remote (issue 40), the victim being this test's
user and the other a real second user (`nobody`, tests/second_user.py) who writes the remote's root first:
- his `LATEST`, `BEST` or `init` planted before the run: on main `run --check` said OK and (for a user who may not
  replace another's file in a sticky directory) every sync failed with EPERM, the run ending with exit 1, which is
  not final; now `--check` and the start refuse the remote, final (exit 2), naming the entry, which is left as it
  is;
- his `init` holding a FIFO `source.json`, planted once the run has started (past the start's check): on main the
  LoRA run ended `done` with no copy of its base on the remote and no word of it; now it ends `failed`, exit 1
  (systemd starts it again; the start then refuses the remote, exit 2), saying the base has no durable copy.
"""
from __future__ import annotations

import os
import shutil
import signal
import stat

import pytest

from minilmd.config import load_config
from second_user import second_user, sh_as_user, shared  # noqa: F401 - shared: a fixture
from supervisor_helpers import (
    cli,
    events,
    run_supervisor,
    start_supervisor,
    state,
    wait_for,
    wait_or_kill,
    write_config,
)

PLANT = {
    "LATEST": "echo step-00000001 > LATEST",
    "BEST": "echo step-00000001 > BEST",
    "init": "mkdir init && mkfifo init/source.json",
}


@pytest.mark.parametrize("entry", sorted(PLANT))
def test_another_users_pointer_or_init_in_the_remote_is_final_at_check_and_at_start(tmp_path, corpus, shared, entry):
    uid, _ = second_user()
    config = write_config(tmp_path, corpus, run={"remote": str(shared)})
    sh_as_user(PLANT[entry], cwd=shared)
    before = os.lstat(shared / entry)

    checked = cli("run", "--check", str(config))
    out = checked.stdout + checked.stderr
    assert checked.returncode == 2, out[-2000:]
    assert f"{entry} there is" in out and f"owned by uid {uid}" in out and "not this run's" in out, out[-2000:]

    code = run_supervisor(config, tmp_path)
    said = (tmp_path / "supervisor.out").read_text()
    assert code == 2, said[-2000:]  # final: systemd's RestartPreventExitStatus lists it
    assert f"{entry} there is" in said, said[-2000:]
    after = os.lstat(shared / entry)
    assert (after.st_uid, after.st_ino, after.st_mtime_ns) == (before.st_uid, before.st_ino, before.st_mtime_ns)
    assert not [p for p in shared.iterdir() if p.name.startswith("step-")]  # nothing synced beside it


@pytest.mark.slow
def test_a_lora_run_whose_base_copy_another_user_blocks_is_not_done_silently(tmp_path, corpus, undisturbed, shared):
    uid, _ = second_user()
    base = shutil.copytree(undisturbed().checkpoint, tmp_path / "share" / "base")
    config = write_config(tmp_path, corpus, run={"remote": str(shared)}, init={"from": str(base)},
                          lora={"rank": 4, "alpha": 8.0}, train={"max_steps": 4, "checkpoint_every": 4})
    cfg = load_config(config)
    proc = start_supervisor(config, tmp_path / "supervisor.out", fake=False)
    try:
        # state.json is written once the start's checks passed; the supervisor is held there while he plants his
        # `init`, so no sync of it can have run before
        wait_for(lambda: (cfg.run_dir / "state.json").is_file(), 120, "the supervisor started")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            sh_as_user(PLANT["init"], cwd=shared)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        code = wait_or_kill(proc, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = (tmp_path / "supervisor.out").read_text()
    final = state(cfg.run_dir)
    assert code == 1 and final["phase"] == "failed", said[-3000:]  # not final: systemd starts it again
    assert "LoRA base" in final["reason"] and "init" in final["reason"], final["reason"]
    assert any("the LoRA base has no durable copy" in e.get("message", "") for e in events(cfg.run_dir)), said[-3000:]
    assert (shared / "step-00000004").is_dir()  # the checkpoints were synced all the same
    left = os.lstat(shared / "init" / "source.json")  # his FIFO, left as it is
    assert stat.S_ISFIFO(left.st_mode) and left.st_uid == uid

    again = run_supervisor(config, tmp_path)  # as systemd would: now refused at the start, final
    assert again == 2, (tmp_path / "supervisor.out").read_text()[-2000:]


def test_learning_the_owner_the_share_gives_leaves_nothing_and_uses_a_name_a_syncs_clean_up_knows(tmp_path,
                                                                                                  monkeypatch):
    from minilmd import names, perms, tmpnames
    from minilmd.daemon.jobs import remote_write

    monkeypatch.setattr(remote_write, "OWN_UIDS", perms.LearntOwners())
    monkeypatch.setattr(perms, "own_uid", lambda: os.geteuid() + 1)  # as if the share gave this process's files another
    assert remote_write.learn_own_uid(str(tmp_path))
    assert os.geteuid() in remote_write.OWN_UIDS  # what this share gives this process's files
    assert list(tmp_path.iterdir()) == []
    host = tmpnames.host_tag()
    probe = tmpnames.atomic_tmp_prefix(names.LATEST) + tmpnames.pointer_tmp_tag(host, os.getpid()) + "owner.tmp"
    assert tmpnames.remote_tmp_owner(probe, host) == os.getpid()  # a killed probe's leftover is swept
