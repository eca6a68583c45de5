"""A team run.remote (group-writable, not sticky) whose owner.json a teammate replaces while the run trains: before,
every sync after it was refused and the run ended `failed` (exit 1); later it ended `done`, exit 0, `unsynced`
(no service manager restarts that, and the last checkpoint stayed only in scratch: /dev/shm loses it at the next
reboot). Now a remote whose owner record is no longer this run's is a remote out of reach with its reason said:
training goes on, the checkpoints stay in scratch, the sync is retried and never writes there; once the run has
finished, its last sync waits (SyncWorker.final_sync) in `stopping`, said in status, the log and to a stage after it,
holding neither trainer nor GPU, until the record is this run's again or gone: then the run ends finished and
synced; a stop meanwhile ends it `stopped`. Run by the victim (root) against a real second user, `nobody`, in the
team's group; the GPU's case in this process with a scripted NVML, the foreign record made by os.chown."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fakes_nvml import FREE, FakeNvml
from minilmd import names, run_owner
from minilmd.config import load_config
from minilmd.daemon.child.process import TRAINER_CMD_ENV
from minilmd.daemon.host import leases
from minilmd.daemon.host.gpu import GpuAdmission
from minilmd.daemon.jobs import keptcopy
from minilmd.daemon.supervisor import Infra, Supervisor
from minilmd.init_source import predecessor, predecessor_report
from minilmd.protocol import how_ended
from second_user import as_user, group_dir, teammate  # noqa: F401 - the fixture
from slurm_helpers import fake_scontrol
from supervisor_helpers import (
    FAKE_TRAINER,
    cli,
    events,
    start_supervisor,
    state,
    wait_for,
    wait_or_kill,
    write_config,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPLACE = 'rm -f "$1" && cat > "$1"'
"""What the teammate does: her owner.json unlinked (a non-sticky directory his group writes), his own in its place."""
WAITING = "final sync waiting: "


def _replace_claim(remote: Path, run_dir: Path) -> None:
    record = run_owner.encode(run_owner.record(run_dir, "s"))  # even one naming her run: his file is no claim of hers
    done = subprocess.run(as_user(["sh", "-c", REPLACE, "sh", str(remote / names.REMOTE_OWNER)]), input=record,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr


def _remote_step(run_dir: Path) -> int:
    return (state(run_dir).get("remote_checkpoint") or {}).get("step") or 0


def _said(run_dir: Path) -> list[str]:
    return [e.get("message", "") for e in events(run_dir)]


def _waits(run_dir: Path) -> bool:
    return (state(run_dir).get("reason") or "").startswith(WAITING)


@contextlib.contextmanager
def _killed_after(proc: subprocess.Popen):
    """proc, killed afterwards if a check failed while it ran."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)


@contextlib.contextmanager
def _last_sync_waiting(teammate, tmp_path: Path, corpus, **env):
    """A run whose record the teammate replaced after step 10's sync, trained to its end (step 30), its last sync
    waiting: (supervisor, config, run_dir, remote); the supervisor is killed afterwards if a check failed. `env`: the
    supervisor's environment beside it (a Slurm job's)."""
    (uid, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote)})
    run_dir, release = tmp_path / "s" / "run", tmp_path / "release"
    proc = start_supervisor(config, tmp_path / "supervisor.out", FAKE_HOLD=f"15:{release}", **env)
    with _killed_after(proc):
        try:
            wait_for(lambda: _remote_step(run_dir) == 10, timeout=120, what="step 10 synced")
            _replace_claim(remote, run_dir)
            release.touch()  # steps 20 and 30 are saved and their syncs refused
            wait_for(lambda: _waits(run_dir) or proc.poll() is not None, timeout=180, what="the last sync to wait")
            assert proc.poll() is None, f"the run ended (exit {proc.poll()}) with its last checkpoint unsynced: " \
                                        f"{state(run_dir).get('reason')}"
            yield proc, config, run_dir, remote
        finally:
            release.touch()


def test_a_replaced_owner_record_makes_the_last_sync_wait_in_status_until_it_is_gone(teammate, tmp_path, corpus):
    (uid, _), _ = teammate
    with contextlib.ExitStack() as stack:
        proc, config, run_dir, remote = stack.enter_context(_last_sync_waiting(teammate, tmp_path, corpus))
        st = state(run_dir)
        assert st["phase"] == "stopping" and f"uid {uid}" in st["reason"] and "owner.json" in st["reason"], st
        assert st.get("child") is None  # the trainer has exited: nothing but the sync is held
        tries = st["sync"]["attempts"]
        # retried at the backoff, state.json written all the while (a stage after it reads it as alive), the
        # wait said once while its refusal stays the same
        wait_for(lambda: state(run_dir)["sync"]["attempts"] >= tries + 2, timeout=120, what="two more tries")
        beat = state(run_dir)["updated"]
        wait_for(lambda: state(run_dir)["updated"] > beat, timeout=60, what="state.json to be written again")
        said = _said(run_dir)
        assert len([m for m in said if m.startswith(WAITING)]) == 1, said
        waiting = next(m for m in said if m.startswith(WAITING))
        assert f"uid {uid}" in waiting and "minilmd stop" in waiting and "no try counts" in waiting, waiting
        assert not any("that was the last of" in m for m in said), said  # no try counted, none the last
        shown = cli("status", str(config)).stdout
        assert "stopping" in shown and WAITING in shown and f"uid {uid}" in shown, shown  # whose, and the way out
        later = predecessor_report(predecessor(str(config)))  # a stage whose init.from names this run
        assert later.outcome == "waiting" and later.last_sync_waits, later
        assert "not on its run.remote yet" in later.why and f"uid {uid}" in later.why, later.why
        stage = write_config(tmp_path, corpus, name="t", init={"from": str(config)})  # such a stage, started now
        stage_dir = tmp_path / "t" / "run"
        then = stack.enter_context(_killed_after(start_supervisor(stage, tmp_path / "stage.out")))
        wait_for(lambda: any(m.startswith("init.from: ") for m in _said(stage_dir)) or then.poll() is not None,
                 timeout=120, what="the stage's wait said")
        assert then.poll() is None and state(stage_dir)["phase"] == "waiting_init", state(stage_dir)
        told = next(m for m in _said(stage_dir) if m.startswith("init.from: "))
        assert "not on its run.remote yet" in told and WAITING in told and f"uid {uid}" in told, told
        wait_for(lambda: (state(stage_dir).get("init_wait") or {}).get("running") is True, timeout=60,
                 what="the stage's state.json to say its predecessor runs")  # alive: a wait, said why
        assert _remote_step(run_dir) == 10
        assert not (remote / names.step_name(30)).exists()  # never written into while the record is his
        assert (remote / names.REMOTE_OWNER).stat().st_uid == uid
        assert (tmp_path / "s" / "scratch" / "checkpoints" / names.step_name(30)).is_dir()  # kept in scratch
        # the way out: the record's owner removes his file; the waiting last sync claims the remote and syncs
        done = subprocess.run(as_user(["rm", str(remote / names.REMOTE_OWNER)]), capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert wait_or_kill(proc, timeout=180) == 0
        assert wait_or_kill(then, timeout=180) == 0  # the stage after it starts from its synced step 30
    final = state(run_dir)
    assert how_ended(final) == "finished" and _remote_step(run_dir) == 30, final
    assert (remote / names.step_name(30)).is_dir()
    assert (remote / names.REMOTE_OWNER).stat().st_uid == os.getuid()  # claimed again, hers
    assert how_ended(state(stage_dir)) == "finished", state(stage_dir)
    assert any("run s finished at step 30" in m for m in _said(stage_dir)), _said(stage_dir)


def test_a_stop_while_the_last_sync_waits_for_the_owner_record_ends_the_run_stopped(teammate, tmp_path, corpus):
    (uid, _), _ = teammate
    with _last_sync_waiting(teammate, tmp_path, corpus) as (proc, config, run_dir, remote):
        stopped = cli("stop", str(config), timeout=120)
        assert stopped.returncode == 3 and "NOT SYNCED" in stopped.stdout, stopped  # its newest only in scratch
        assert wait_or_kill(proc, timeout=180) == 0
    final = state(run_dir)
    assert final["phase"] == "done" and how_ended(final) == "stopped", final
    assert f"uid {uid}" in final["reason"], final["reason"]  # why its newest checkpoint is not synced
    assert _remote_step(run_dir) == 10 and not (remote / names.step_name(30)).exists()
    assert (remote / names.REMOTE_OWNER).stat().st_uid == uid  # his file, left as it is
    assert (tmp_path / "s" / "scratch" / "checkpoints" / names.step_name(30)).is_dir()  # the checkpoint stays


class FakeGpuInfra(Infra):
    def __init__(self, nvml):
        self.nvml = nvml

    def open_gpu(self, cfg):
        return GpuAdmission(self.nvml, cfg.gpu, run_name=cfg.run.name)


def _leases_free(lock_dir: Path) -> bool:
    """Whether another run could take each card leased in lock_dir now: no flock held on its lease file."""
    found = sorted(lock_dir.glob("gpu-*.lock"))
    free = []
    for path in found:
        lease = leases.open_lease(lock_dir, path.name)
        try:
            free.append(leases.try_lock(lease, exclusive=True))
        finally:
            lease.close()
    return bool(found) and all(free)


def test_the_waiting_last_sync_gives_the_gpu_back(tmp_path, corpus, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root: the teammate's owner.json is made another user's by os.chown")
    release, stranger = tmp_path / "release", 54321
    monkeypatch.setenv(TRAINER_CMD_ENV, f"{sys.executable} {FAKE_TRAINER}")
    monkeypatch.setenv("FAKE_HOLD", f"15:{release}")
    config = write_config(tmp_path, corpus, train={"device": "cuda"},
                          gpu={"count": 1, "poll_interval": "0.05s", "stable_polls": 1,
                               "lock_dir": str(tmp_path / "gpu-locks")})
    cfg = load_config(config)
    remote, seen = Path(cfg.run.remote), {}

    def the_teammate():
        try:
            wait_for(lambda: _remote_step(cfg.run_dir) == 10, timeout=120, what="step 10 synced")
            record = remote / names.REMOTE_OWNER
            record.unlink()
            record.write_bytes(run_owner.encode(run_owner.record(cfg.run_dir, "s")))
            os.chown(record, stranger, stranger)
            release.touch()
            wait_for(lambda: _waits(cfg.run_dir), timeout=180, what="the last sync to wait")
            wait_for(lambda: _leases_free(tmp_path / "gpu-locks"), timeout=60, what="the card's lease to be free")
            seen["free"], seen["phase"] = True, state(cfg.run_dir)["phase"]
        finally:
            release.touch()
            (remote / names.REMOTE_OWNER).unlink(missing_ok=True)  # the way out: the run ends synced

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    helper = threading.Thread(target=the_teammate, daemon=True)
    helper.start()
    try:
        status = Supervisor(cfg, str(config), infra=FakeGpuInfra(FakeNvml([[FREE]])), echo=False).run()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    helper.join(60)
    assert seen == {"free": True, "phase": "stopping"}, seen  # another run may take the card while it waits
    assert any(m.startswith("the last sync waits: GPU [0] given back") for m in _said(cfg.run_dir))
    assert status == 0
    final = state(cfg.run_dir)
    assert how_ended(final) == "finished" and _remote_step(cfg.run_dir) == 30, final
    assert final["devices"] == [0]  # the card it trained on, still said


def test_slurms_usr1_during_the_owner_record_wait_keeps_the_checkpoint_and_requeues_never_finished(
        teammate, tmp_path, corpus):
    """review11a F1: in a Slurm job, USR1 during the wait ends it at once, never `finished`, exit 0, with the remote
    behind (the allocation is not held by a wait Slurm has said must end). The newest checkpoint is kept in run.dir
    and the job requeued, counted as after the final sync's wait (daemon/slurm/unsynced_end.py); before, it ended
    `failed`, exit 1, not requeued: the run stopped until someone resubmitted it."""
    env, calls = fake_scontrol(tmp_path, "4242")
    with _last_sync_waiting(teammate, tmp_path, corpus, **env) as (proc, _config, run_dir, _remote):
        proc.send_signal(signal.SIGUSR1)  # Slurm's time-limit warning (--signal=USR1@...)
        rc = wait_or_kill(proc, 120)
    after = state(run_dir)
    assert _remote_step(run_dir) == 10 and after["progress"]["step"] == 30  # the remote is behind
    assert rc == 0 and after["phase"] == "done", (rc, after["phase"], after.get("outcome"), after.get("reason"))
    assert after["outcome"]["ended"] == "requeued", after["outcome"]
    assert after["reason"].startswith("requeued by Slurm (preempted by USR1): the last sync failed")
    assert "refused" in after["reason"] and "owner.json" in after["reason"], after["reason"]
    assert "requeue 4242" in calls.read_text().splitlines(), calls.read_text()
    assert after["slurm"]["unsynced_requeues"]["count"] == 1, after["slurm"]  # within requeue_bound's bound
    assert (tmp_path / "s" / "scratch" / "checkpoints").is_dir()  # the last checkpoint is kept where it is
    kept = run_dir / keptcopy.KEPT_DIR  # and in run.dir, which the job's end never wipes (daemon/jobs/keptcopy.py)
    assert (kept / names.step_name(30)).is_dir() and str(kept) in after["reason"], after["reason"]

