"""run.scratch removed by hand while the run trains (`rm -rf /dev/shm/minilmd-<uid>/RUN`, a common way to free
/dev/shm; user9 finding 2). Before, the trainer's next save made `checkpoints/` again by path (mkdir parents=True):
a scratch without owner.json, corpus or lock, which the supervisor synced from; the next trainer death then ended
the run "config error, final: ... someone replaced it", the user being that someone, and nothing said that the
remade directory held newer steps than the remote.
Now the trainer makes its checkpoint root once, at its start, and pins it (device, inode; with the scratch above it):
a save that finds it gone or another directory is refused (ScratchGone), one line, fault.json kind scratch_gone, a
restartable exit; the supervisor's next attempt claims scratch afresh, stages, resumes from the remote's newest
checkpoint and says which steps are trained again; the run ends with an undisturbed run's weights, bit for bit.
A directory of the user's own made at the name meanwhile is still refused, in words that blame no stranger and say
what `rm -r` of it loses against the remote's newest step."""
from __future__ import annotations

import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch

from held import PAUSING_TRAINER, held_at
from minilmd import checkpoint_dirs, names, protocol, scratch
from minilmd.checkpoint_pin import ScratchGone
from minilmd.config import load_config
from minilmd.daemon.jobs import scratch_removed
from minilmd.names import FAULT_ENV, TRAINER_CMD_ENV, step_name
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.loop import exits
from supervisor_helpers import (
    events,
    model_sha,
    remove_while_written,
    start_supervisor,
    wait_for,
    wait_or_kill,
    write_config,
)
from trainer_corpus import read_metrics

LONG = 300


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 4)
    return model, torch.optim.AdamW(model.parameters())


def test_a_save_into_a_removed_or_remade_scratch_is_refused_and_makes_nothing(tmp_path):
    where = tmp_path / "scratch"
    where.mkdir()
    model, opt = _model()
    saver = ckpt_io.AsyncCheckpointer(where / names.CHECKPOINTS, keep=None, background=False, parents=False)
    saver.save(1, model, opt, {"step": 1})
    shutil.rmtree(where)  # the user's `rm -rf` while the run trains
    with pytest.raises(ScratchGone) as gone:
        saver.save(2, model, opt, {"step": 2})
    assert gone.value.step == 2 and str(gone.value) == f"{where} is not there any more: checkpoint " \
                                                       f"{step_name(2)} not saved"
    assert not where.exists()  # before: made again by path, checkpoints/step-00000002 in it

    where.mkdir()
    saver = ckpt_io.AsyncCheckpointer(where / names.CHECKPOINTS, keep=None, background=False, parents=False)
    where.rename(tmp_path / "aside")  # moved away (its inodes kept: a new directory surely gets others)
    (where / names.CHECKPOINTS).mkdir(parents=True)  # and another directory made at the name
    with pytest.raises(ScratchGone, match=f"^{where} is another directory now"):
        saver.save(3, model, opt, {"step": 3})
    assert os.listdir(where / names.CHECKPOINTS) == []


def test_a_supervised_trainer_whose_scratch_is_gone_at_its_start_makes_nothing(tmp_path):
    with pytest.raises(ScratchGone, match="is not there at the trainer's start: nothing can be saved"):
        ckpt_io.AsyncCheckpointer(tmp_path / "gone" / names.CHECKPOINTS, keep=None, parents=False)
    assert not (tmp_path / "gone").exists()
    ckpt_io.AsyncCheckpointer(tmp_path / "by-hand" / names.CHECKPOINTS, keep=None)  # on its own: made with parents
    assert (tmp_path / "by-hand" / names.CHECKPOINTS).is_dir()


def test_the_trainer_exits_restartable_with_one_line_and_a_scratch_gone_note(tmp_path, corpus, monkeypatch, capsys):
    cfg = load_config(write_config(tmp_path, corpus, remote=False))
    cfg.run_dir.mkdir(parents=True)
    monkeypatch.setenv(names.RUN_DIR_ENV, str(cfg.run_dir))
    monkeypatch.setenv(names.SUPERVISOR_PROCESS_ENV, "1 1 not-this-host")  # a supervisor's, on another host
    e = ScratchGone(cfg.checkpoint_dir, 8, f"{cfg.scratch_dir} is not there any more")
    assert exits.status_of(cfg, e, None, 8) == protocol.EXIT_CRASH  # restarted: the supervisor stages again
    line = (f"run.scratch {cfg.scratch_dir} was removed while the run trained ({cfg.scratch_dir} is not there any "
            f"more): step 8 not saved; the supervisor stages again and resumes from the newest synced checkpoint")
    assert capsys.readouterr().err == f"minilmd train: {line}\n"
    fault = protocol.read_fault(cfg.run_dir)
    assert protocol.fault_note(fault) is protocol.FaultNote.SCRATCH_GONE and fault["message"] == line, fault


def _checkpoint_named(root: Path, step: int) -> None:
    """A step directory as list_checkpoints counts one (a manifest in it: names only, no validation)."""
    (root / step_name(step)).mkdir(parents=True)
    (root / step_name(step) / names.MANIFEST).write_text("{}")


def test_a_directory_of_ones_own_made_at_the_claimed_scratchs_name_is_refused_saying_what_rm_loses(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setattr(scratch, "_held", {})  # this test's claims only
    run_dir, where = tmp_path / "run", tmp_path / "shm" / "r"
    run_dir.mkdir()
    scratch.claim(where, run_dir, "r", False)
    where.rename(tmp_path / "aside")  # gone from its name (moved: a directory made now surely has another inode)
    _checkpoint_named(where / names.CHECKPOINTS, 12)  # what an older trainer made again by path, and saved into
    with pytest.raises(scratch.ScratchChanged) as refused:
        scratch.claim(where, run_dir, "r", False)
    e = refused.value
    assert e.remade and e.newest_there == 12
    words = scratch_removed.changed(e, where, 8)
    assert "someone" not in words and "check who can change" not in words, words  # before: the user blamed
    assert f"run.scratch {where} is not the directory this run claimed" in words, words
    assert "its newest checkpoint is step 12; " in words, words
    assert words.endswith(f"; run.remote's newest is step 8: `rm -r {where}` loses steps 9..12, which are only "
                          f"there, and the run, started again, resumes from step 8"), words
    assert scratch_removed.changed(e, where, 12).endswith(f"`rm -r {where}` loses no step the remote lacks, and "
                                                          f"the run, started again, resumes from step 12")
    assert scratch_removed.changed(e, where, None).endswith(f"no step of the run is on a run.remote: `rm -r {where}` "
                                                            f"loses steps up to 12, the only copy, and the run, "
                                                            f"started again, starts from step 0")


def _synced_newest(scratch_checkpoints: Path, remote: Path) -> int | None:
    """The newest whole checkpoint in scratch once the remote's LATEST names it, else None."""
    newest = max(checkpoint_dirs.local_checkpoint_steps(scratch_checkpoints), default=None)
    return newest if newest is not None and checkpoint_dirs.read_latest(remote) == step_name(newest) else None



@pytest.mark.slow  # a real supervisor, the real trainer held still by SIGSTOP, and an undisturbed run to compare
def test_scratch_removed_while_the_real_trainer_trains_is_staged_again_and_the_run_ends_bit_identical(tmp_path,
                                                                                                    undisturbed):
    straight = undisturbed()  # 16 steps, a checkpoint every 4
    # a trainer held still (SIGSTOP) is no hang here: the test's looks take the time they take under load
    config = straight.config_like(tmp_path, "gone", remote=True, restart={"hang_timeout": "600s"})
    cfg = load_config(config)
    run_dir, remote, out = cfg.run_dir, Path(cfg.run.remote), tmp_path / "supervisor.out"
    pausing = {FAULT_ENV: "pause@10", TRAINER_CMD_ENV: f"{sys.executable} {PAUSING_TRAINER}"}
    sup = start_supervisor(config, out, fake=False, **pausing)
    try:
        # held with step 4 written whole (step 8's save waited for it) and step 8's write maybe under way in its
        # writer thread, held too: the newest whole one synced is the step the run must resume from
        trainer = held_at(run_dir, "pause@10")
        synced = wait_for(lambda: _synced_newest(cfg.checkpoint_dir, remote), LONG, "scratch's newest synced")
        assert synced in (4, 8), synced
        remove_while_written(cfg.scratch_dir)  # `rm -rf /dev/shm/minilmd-<uid>/gone`, beside the supervisor's prune
        os.kill(trainer, signal.SIGCONT)  # trains steps 10..12; a save then finds scratch gone
        rc = wait_or_kill(sup, 600)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    text = out.read_text()
    assert rc == 0, text[-4000:]
    first = (run_dir / "logs" / "attempt-0001.log").read_text()
    assert f"minilmd train: run.scratch {cfg.scratch_dir} was removed while the run trained (" in first, first[-3000:]
    assert re.search(r"\): step (8|12) not saved; the supervisor stages again and resumes from the newest synced "
                     r"checkpoint\n", first), first[-3000:]  # 8: its write, under way at the removal, failed
    assert "Traceback" not in first, first[-3000:]
    assert text.count(scratch_removed.claimed_again(cfg.scratch_dir)) == 1, text[-4000:]
    resumed = re.findall(rf"run.scratch {re.escape(str(cfg.scratch_dir))} was removed while the run trained: staged "
                         rf"again; resuming from step {synced} \(the remote's newest\); steps {synced + 1}\.\.(\d+) "
                         rf"trained again", text)
    assert len(resumed) == 1 and synced < int(resumed[0]) <= 12, text[-4000:]
    assert "config error" not in text and "someone replaced it" not in text, text[-4000:]
    fetched = [e for e in events(run_dir) if e["event"] == "fetch" and e.get("step") == synced]
    assert len(fetched) == 1, events(run_dir)  # resumed from the remote's newest, scratch's being gone
    steps = [m["step"] for m in read_metrics(run_dir, "train")]
    assert steps[synced - 16:] == list(range(synced + 1, 17)), steps  # after the restart, none skipped
    assert checkpoint_dirs.read_latest(remote) == step_name(16)
    assert model_sha(remote / step_name(16)) == model_sha(straight.checkpoint)
