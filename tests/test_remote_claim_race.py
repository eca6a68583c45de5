"""Two new runs started together on one run.remote (a new user's report, reproduced twice): both passed `minilmd run
--check` (no owner.json yet), both launched; the first sync claimed the remote and every sync of the other was
refused. Before, the loser trained on ("training goes on"), then sat in `stopping` for ever, its last sync waiting
for a claim whose removal (which its words advised) made none of the winner's checkpoints its own: the next refusal
said `holds checkpoints ... and no owner.json`, and still "once ... gone, the syncs go on". Its ~1,100-character
refusal was shown three times by `status`.

Now a remote that is another run's is a final refusal, as at the launch: the loser stops at once (its trainer saves
first), ends `failed`, exit 2, unattended, its checkpoints kept in scratch, its reason saying the way on that works:
set run.remote to a directory of its own, then `minilmd run CONFIG` again, which resumes from them and syncs them
there. The winner's checkpoints and claim are untouched. Two real supervisors with the fake trainer."""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs, names, run_owner
from minilmd.config import load_config
from minilmd.daemon.jobs import remote_claim
from minilmd.daemon.jobs.remote_local import open_remote
from minilmd.protocol import FINAL_SYNC_WAITING, SUPERVISOR_CONFIG, how_ended
from supervisor_helpers import (
    cli,
    events,
    remote_step,
    run_supervisor,
    start_supervisor,
    state,
    wait_for,
    wait_for_synced,
    wait_or_kill,
    write_config,
)

pytestmark = pytest.mark.slow

NEVER_ENDS = 1_000_000
"""A loser's budget no test waits for (20,000 s of the fake trainer's steps): it ends only if it is stopped."""


def _said(run_dir: Path) -> list[str]:
    return [e.get("message", "") for e in events(run_dir)]


def _stuck(run_dir: Path) -> bool:
    """What the loser did before: trained on with its syncs refused, or waited in `stopping` for the claim."""
    return any("training goes on" in m for m in _said(run_dir)) or \
        (state(run_dir).get("reason") or "").startswith(FINAL_SYNC_WAITING)


def _release_and_end(releases: tuple[Path, ...], procs: tuple) -> None:
    """Each held trainer let go, then each supervisor still running killed: a failed assertion leaves none behind."""
    for release in releases:
        release.touch()
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)


def _trained_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / names.METRICS).read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r.get("kind") == "train"]


@pytest.mark.parametrize("loser_steps", [NEVER_ENDS, 10], ids=["mid-run", "at-its-end"])
def test_the_loser_of_two_runs_started_on_one_remote_stops_keeps_its_checkpoints_and_is_told_the_way_on(
        tmp_path, corpus, loser_steps):
    shared = tmp_path / "nfs" / "race"
    winner_cfg = write_config(tmp_path, corpus, name="a", remote=False, run={"remote": str(shared)})
    loser_cfg = write_config(tmp_path, corpus, name="b", remote=False, run={"remote": str(shared)},
                             train={"max_steps": loser_steps})
    winner, loser = load_config(winner_cfg), load_config(loser_cfg)
    for config in (winner_cfg, loser_cfg):  # neither has synced: both pass, as the user saw
        checked = cli("run", "--check", str(config))
        assert checked.returncode == 0, checked.stdout + checked.stderr

    # launched together; the winner's first sync claims the remote before the loser's first checkpoint
    release_loser, release_winner = tmp_path / "release-b", tmp_path / "release-a"
    losing = start_supervisor(loser_cfg, tmp_path / "b.out", FAKE_HOLD=f"5:{release_loser}")
    winning = start_supervisor(winner_cfg, tmp_path / "a.out", FAKE_HOLD=f"15:{release_winner}")
    try:
        wait_for(lambda: (state(loser.run_dir).get("progress") or {}).get("step") == 5 or losing.poll() is not None,
                 timeout=180, what="the loser to train to step 5")
        wait_for_synced(winner.run_dir, 10, winning, tmp_path / "a.out")
        assert remote_claim.read(open_remote(str(shared)))["run_dir"] == run_owner.run_identity(winner.run_dir)
        release_loser.touch()  # its checkpoints are saved now, and its syncs refused

        wait_for(lambda: losing.poll() is not None or _stuck(loser.run_dir), timeout=300,
                 what="the loser to end, or to be stuck as before")
        assert not _stuck(loser.run_dir), f"the loser trains on or waits for the claim: {_said(loser.run_dir)[-4:]}"
        rc = wait_or_kill(losing, timeout=300)  # it ends unattended
        after = state(loser.run_dir)
        assert rc == SUPERVISOR_CONFIG and after["phase"] == "failed", (rc, after.get("reason"))
        assert how_ended(after) == "failed" and after["outcome"]["exit"] == SUPERVISOR_CONFIG, after["outcome"]
        reason = after["reason"]
        assert reason.startswith("config error, final: run.remote ") and "belongs to another run" in reason, reason
        assert str(winner.run_dir) in reason, reason
        assert f"set run.remote to a directory of this run's own, then `minilmd run {loser_cfg}` again" in reason
        assert "remove" not in reason and len(reason) < 700, reason  # no way that fails; a line, not a page
        assert "remove" not in next(m for m in _said(loser.run_dir) if m.startswith("sync refused, final: "))
        kept = checkpoint_dirs.local_checkpoint_steps(loser.checkpoint_dir)  # kept in scratch, named in the reason
        assert kept and str(loser.checkpoint_dir / names.step_name(kept[-1])) in reason, (kept, reason)
        if loser_steps == NEVER_ENDS:  # stopped as soon as it learnt, its trainer saving first: not trained on
            assert any("ended: stopped (exit 75)" in m for m in _said(loser.run_dir)), _said(loser.run_dir)[-6:]
            assert kept[-1] == after["progress"]["step"] < loser_steps

        shown = cli("status", str(loser_cfg)).stdout  # the refusal said once, the other lines pointing to it
        assert shown.count("belongs to another run") == 1 and "sync: failed (said above)" in shown, shown
        assert "last error" not in shown or "said above" in shown.split("last error", 1)[1].split("\n", 1)[0], shown

        release_winner.touch()
        assert wait_or_kill(winning, timeout=300) == 0, (tmp_path / "a.out").read_text()[-3000:]
    finally:
        _release_and_end((release_loser, release_winner), (losing, winning))
    assert remote_step(winner.run_dir) == 30 and checkpoint_dirs.read_latest(shared) == "step-00000030"
    assert remote_claim.read(open_remote(str(shared)))["run_dir"] == run_owner.run_identity(winner.run_dir)

    # the way on the reason gives: a run.remote of its own, `minilmd run` again: it resumes from what it kept
    stopped_at = kept[-1]
    own = tmp_path / "nfs" / "b-own"
    again = write_config(tmp_path, corpus, name="b", remote=False, run={"remote": str(own)},
                         train={"max_steps": stopped_at + 10 if loser_steps == NEVER_ENDS else loser_steps})
    assert again == loser_cfg
    checked = cli("run", "--check", str(again))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (tmp_path / "again").mkdir()
    assert run_supervisor(again, tmp_path / "again") == 0, (tmp_path / "again" / "supervisor.out").read_text()[-3000:]
    final = state(loser.run_dir)
    assert how_ended(final) == "finished", final.get("reason")
    newest = load_config(again).train.max_steps
    assert remote_step(loser.run_dir) == newest and checkpoint_dirs.read_latest(own) == names.step_name(newest)
    assert remote_claim.read(open_remote(str(own)))["run_dir"] == run_owner.run_identity(loser.run_dir)
    steps = _trained_steps(loser.run_dir)
    assert steps.count(1) == 1 and all(s > stopped_at for s in steps[steps.index(stopped_at) + 1:]), steps
    assert re.search(rf"synced step {newest} to {re.escape(str(own))}", "\n".join(_said(loser.run_dir)))


def test_a_slurm_jobs_loser_keeps_its_newest_in_run_dir_is_not_requeued_and_resumes_from_it(tmp_path, corpus):
    """The loser in a Slurm job on its node-local scratch, which the job's end may wipe: its newest checkpoint is
    kept in run.dir (daemon/jobs/keptcopy.py), the job is not requeued (a requeued start would be refused at its
    launch, exit 2), and the resubmitted job, its run.remote a directory of its own, on another node, resumes from
    that copy and syncs it there."""
    from minilmd.daemon.jobs import keptcopy
    from slurm_helpers import job_line, slurm_env

    shared = tmp_path / "nfs" / "race"
    winner_cfg = write_config(tmp_path, corpus, name="a", remote=False, run={"remote": str(shared)})
    loser_cfg = write_config(tmp_path, corpus, name="b", remote=False, run={"remote": str(shared), "scratch": ""},
                             train={"max_steps": NEVER_ENDS})
    winner, loser = load_config(winner_cfg), load_config(loser_cfg)
    release_loser, release_winner = tmp_path / "release-b", tmp_path / "release-a"
    job_line(tmp_path, 0, time.time() + 3600)
    losing = start_supervisor(loser_cfg, tmp_path / "b.out", **slurm_env(tmp_path, 0), FAKE_HOLD=f"5:{release_loser}")
    winning = start_supervisor(winner_cfg, tmp_path / "a.out", FAKE_HOLD=f"15:{release_winner}")
    try:
        wait_for(lambda: (state(loser.run_dir).get("progress") or {}).get("step") == 5 or losing.poll() is not None,
                 timeout=180, what="the loser to train to step 5")
        wait_for_synced(winner.run_dir, 10, winning, tmp_path / "a.out")
        release_loser.touch()
        wait_for(lambda: losing.poll() is not None or _stuck(loser.run_dir), timeout=300,
                 what="the loser to end, or to be stuck as before")
        rc = wait_or_kill(losing, timeout=300)
        release_winner.touch()
        assert wait_or_kill(winning, timeout=300) == 0, (tmp_path / "a.out").read_text()[-3000:]
    finally:
        _release_and_end((release_loser, release_winner), (losing, winning))
    after = state(loser.run_dir)
    assert rc == SUPERVISOR_CONFIG and after["phase"] == "failed", (rc, after.get("reason"), _said(loser.run_dir)[-5:])
    calls = tmp_path / "scontrol-calls"
    assert not calls.exists() or "requeue" not in calls.read_text(), calls.read_text()  # refused again if requeued
    stopped_at = after["progress"]["step"]
    kept = loser.run_dir / keptcopy.KEPT_DIR / names.step_name(stopped_at)
    assert (kept / names.MANIFEST).is_file() and str(kept) in after["reason"], after["reason"]
    assert "belongs to another run" in after["reason"] and "set run.remote to a directory of this run's own" in \
        after["reason"], after["reason"]
    assert checkpoint_dirs.read_latest(shared) == "step-00000030"  # the winner's, untouched

    # resubmitted on another node (the first one's scratch gone with its job), run.remote a directory of its own
    shutil.rmtree(tmp_path / "node-tmp")
    own = tmp_path / "nfs" / "b-own"
    write_config(tmp_path, corpus, name="b", remote=False, run={"remote": str(own), "scratch": ""},
                 train={"max_steps": stopped_at + 10})
    job_line(tmp_path, 1, time.time() + 3600)
    again = start_supervisor(loser_cfg, tmp_path / "again.out", **slurm_env(tmp_path, 1))
    assert wait_or_kill(again, 300) == 0, (tmp_path / "again.out").read_text()[-3000:]
    final = state(loser.run_dir)
    assert how_ended(final) == "finished" and remote_step(loser.run_dir) == stopped_at + 10, final.get("reason")
    assert any(f"resuming from step {stopped_at}" in m for m in _said(loser.run_dir)), _said(loser.run_dir)[-12:]
    assert not kept.exists()  # synced: the copy in run.dir goes
