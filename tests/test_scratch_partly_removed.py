"""run.scratch removed in part, or just before the last sync (fault11 F1, F2).

F1: an `rm -rf` of scratch that races a checkpoint save fails with "Directory not empty": scratch/ and
scratch/checkpoints/ stay, owner.json, corpus/ and trainer.lock go. The trainer's pin compared the directories'
identity only, so it trained and saved on; at the next restage the claim refused the very directory this supervisor
had claimed ("already holds files (checkpoints) and no owner.json", exit 2, final) and the run never finished. Now
the pin says "scratch's owner.json is gone" (the trainer stops at its next save), and the claim marks the directory
this process claimed again and stages: what is left in it is the run's own.
F2: scratch removed after the trainer ended done but before the last sync copied its last step ended the run failed,
exit 79 (final), "the trainer saved its checkpoints somewhere else ... a restart would end the same". Now the run
claims scratch afresh, resumes from run.remote's newest and trains the last steps again, unattended."""
from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest
import torch

from held import PAUSING_TRAINER, held_at
from minilmd import checkpoint_dirs, fsio, names, scratch, scratch_remade
from minilmd.checkpoint_pin import ScratchGone
from minilmd.config import load_config
from minilmd.names import FAULT_ENV, SCRATCH_OWNER, TRAINER_CMD_ENV, step_name
from minilmd.trainer.checkpoint import save as ckpt_io
from supervisor_helpers import events, model_sha, start_supervisor, state, wait_for, wait_or_kill

LONG = 300
GONE_AT_END = Path(__file__).with_name("scratch_gone_at_end_trainer.py")


def _remove_all_but_checkpoints(where: Path) -> None:
    """What a `rm -rf` that raced a save leaves: the scratch and its checkpoints/, nothing else."""
    import shutil

    for entry in where.iterdir():
        if entry.name == names.CHECKPOINTS:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def test_scratch_removed_between_a_saves_last_write_and_its_publish_is_scratch_gone(tmp_path, monkeypatch):
    """An `rm -rf` of scratch that lands after a save's last write, before its publish looks at its temporary
    directory by name: the publish finds none there (dirfd.Replaced, a ValueError), which ended the trainer as a
    crash with "the temporary directory was replaced by another one" (seen under load in
    test_scratch_removed.py's real run), where the removed scratch is ScratchGone: staged again, resumed."""
    import shutil

    where = tmp_path / "scratch"
    where.mkdir()
    (where / SCRATCH_OWNER).write_text("{}")
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    saver = ckpt_io.AsyncCheckpointer(where / names.CHECKPOINTS, keep=None, background=False, parents=False)
    saver.save(1, model, opt, {"step": 1})
    real_publish = fsio.publish

    def removed_first(parent, tmp, *args, **kwargs):
        shutil.rmtree(where)  # the user's `rm -rf`, after the temporary directory was opened, before its publish
        return real_publish(parent, tmp, *args, **kwargs)

    monkeypatch.setattr(fsio, "publish", removed_first)
    with pytest.raises(ScratchGone):
        saver.save(2, model, opt, {"step": 2})
    assert not where.exists()  # nothing made again by path


def test_a_save_into_a_scratch_that_lost_its_owner_record_is_refused(tmp_path):
    where = tmp_path / "scratch"
    where.mkdir()
    (where / SCRATCH_OWNER).write_text("{}")  # a claimed scratch's marker (its words do not matter here)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    saver = ckpt_io.AsyncCheckpointer(where / names.CHECKPOINTS, keep=None, background=False, parents=False)
    saver.save(1, model, opt, {"step": 1})
    _remove_all_but_checkpoints(where)  # before: the pin saw the same directories and saved on
    with pytest.raises(ScratchGone) as gone:
        saver.save(2, model, opt, {"step": 2})
    assert str(gone.value) == f"scratch's {SCRATCH_OWNER} is gone: part of {where} was removed: checkpoint " \
                              f"{step_name(2)} not saved"
    assert checkpoint_dirs.local_checkpoint_steps(where / names.CHECKPOINTS) == [1]


def test_the_claiming_process_marks_its_partly_removed_scratch_again_and_a_stranger_to_it_is_told_what_to_do(
        tmp_path, monkeypatch):
    monkeypatch.setattr(scratch, "_held", {})  # this test's claims only
    run_dir, where = tmp_path / "run", tmp_path / "shm" / "r"
    run_dir.mkdir()
    first = scratch.claim(where, run_dir, "r", False)
    (where / names.CHECKPOINTS / step_name(4)).mkdir(parents=True)
    (where / "corpus").mkdir()
    _remove_all_but_checkpoints(where)
    assert scratch_remade.partly_removed(where, scratch.held_identity(where))
    assert scratch.claim(where, run_dir, "r", False) == first  # before: ScratchRefused, "no owner.json"
    assert (where / SCRATCH_OWNER).is_file() and (where / names.CHECKPOINTS / step_name(4)).is_dir()
    assert not scratch_remade.partly_removed(where, scratch.held_identity(where))

    (where / SCRATCH_OWNER).unlink()  # and a process that never claimed it (a new `minilmd run`): refused, in words
    monkeypatch.setattr(scratch, "_held", {})
    with pytest.raises(scratch.ScratchRefused) as refused:
        scratch.claim(where, run_dir, "r", False)
    words = "; ".join(refused.value.problems)
    assert f"already holds files ({names.CHECKPOINTS}) and no {SCRATCH_OWNER}" in words, words
    assert "that an `rm -rf` only partly removed" in words and f"remove {where} and start the run again" in words
    assert os.listdir(where) == [names.CHECKPOINTS]  # nothing deleted, nothing marked



def _run(sup, out: Path) -> tuple[int, str]:
    try:
        rc = wait_or_kill(sup, 600)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    return rc, out.read_text()


@pytest.mark.slow  # a real supervisor and the real trainer, held still by SIGSTOP, then SIGKILLed
def test_a_scratch_left_with_only_its_checkpoints_and_a_trainer_killed_is_staged_again_and_ends_bit_identical(
        tmp_path, undisturbed):
    straight = undisturbed()  # 16 steps, a checkpoint every 4
    config = straight.config_like(tmp_path, "partly", remote=True, restart={"hang_timeout": "600s"})
    cfg = load_config(config)
    run_dir, remote, out = cfg.run_dir, Path(cfg.run.remote), tmp_path / "supervisor.out"
    pausing = {FAULT_ENV: "pause@10", TRAINER_CMD_ENV: f"{sys.executable} {PAUSING_TRAINER}"}
    sup = start_supervisor(config, out, fake=False, **pausing)
    try:
        trainer = held_at(run_dir, "pause@10")
        _remove_all_but_checkpoints(cfg.scratch_dir)  # the `rm -rf` that met "Directory not empty"
        left = max(checkpoint_dirs.local_checkpoint_steps(cfg.checkpoint_dir), default=None)
        os.kill(trainer, signal.SIGKILL)  # any crash: the restage finds the scratch so
    except BaseException:
        sup.kill()
        raise
    rc, text = _run(sup, out)
    assert rc == 0, text[-4000:]  # before: exit 2, "already holds files (checkpoints) and no owner.json"
    assert "config error" not in text and "no owner.json" not in text, text[-4000:]
    assert text.count(scratch_remade.partly_removed_words(cfg.scratch_dir)) == 1, text[-4000:]
    resumed = re.findall(r"was removed while the run trained: staged again; resuming from step (\d+) \((the newest "
                         r"checkpoint left in it|the remote's newest)\)", text)
    assert resumed == [(str(left), "the newest checkpoint left in it")], (resumed, left, text[-4000:])
    assert (cfg.scratch_dir / SCRATCH_OWNER).is_file()  # marked again
    assert checkpoint_dirs.read_latest(remote) == step_name(16)
    assert model_sha(remote / step_name(16)) == model_sha(straight.checkpoint)


@pytest.mark.slow  # a real supervisor and the real trainer, which removes its scratch as it ends done
def test_scratch_removed_before_the_last_sync_trains_the_last_steps_again_and_ends_done_bit_identical(tmp_path,
                                                                                                    undisturbed):
    straight = undisturbed()
    # one periodic sync (the first checkpoint): the last step is surely not on the remote when scratch goes
    config = straight.config_like(tmp_path, "lastgone", remote=True, sync={"every": "1h"},
                                  restart={"hang_timeout": "600s"})
    cfg = load_config(config)
    run_dir, remote, out = cfg.run_dir, Path(cfg.run.remote), tmp_path / "supervisor.out"
    gone = {TRAINER_CMD_ENV: f"{sys.executable} {GONE_AT_END}", FAULT_ENV: "pause@14",
            "SCRATCH_GONE_AT_END": f"{cfg.scratch_dir}:{tmp_path / 'removed-once'}"}
    # the first periodic sync looks for a checkpoint again every 0.5 s, not 30 (tests/quick_cli.py): sync.every's
    # hour still keeps it the only one
    sup = start_supervisor(config, out, fake=False, quick={"TEST_SYNC_LOOK_AGAIN_S": "0.5"}, **gone)
    try:  # held until the remote holds a step (the first sync's): the run resumes from it
        trainer = held_at(run_dir, "pause@14")
        wait_for(lambda: checkpoint_dirs.read_latest(remote), LONG, "a step synced")
        os.kill(trainer, signal.SIGCONT)
    except BaseException:
        sup.kill()
        raise
    rc, text = _run(sup, out)
    assert (tmp_path / "removed-once").exists()
    assert rc == 0, text[-4000:]  # before: 79, final, "the trainer saved its checkpoints somewhere else"
    assert "somewhere else" not in text and "saved elsewhere" not in text, text[-4000:]
    restage = [e for e in events(run_dir) if e["event"] == "restage" and e.get("old") == "stopping"]
    assert len(restage) == 1, events(run_dir)
    said = restage[0]["message"]
    assert f"the trainer ended done (exit 0) at step 16, but run.scratch {cfg.scratch_dir} was removed before the " \
           f"last sync copied that step ({cfg.scratch_dir} is not there any more): claimed afresh, staging again: " \
           f"the run resumes from step " in said, said
    synced = int(re.search(r"resumes from step (\d+), run.remote's newest, and trains steps", said)[1])
    assert re.search(rf"staged again; resuming from step {synced} \(the remote's newest\); steps {synced + 1}\.\.16 "
                     rf"trained again", text), text[-4000:]
    assert state(run_dir)["outcome"]["ended"] == "finished"
    assert checkpoint_dirs.read_latest(remote) == step_name(16)
    assert model_sha(remote / step_name(16)) == model_sha(straight.checkpoint)
