"""Issue 42's must-show: the four-stage pipeline pretrain -> SFT -> DPO and LoRA DPO started at once under the tmux
launcher (deploy/minilmd-tmux.sh, later stages first), with faults in the DPO stage, finishing unattended, the DPO
stage's final weights bit-identical to an undisturbed DPO run's from the same SFT checkpoint (a fifth session, no
faults).

The DPO stage's faults, in this order: a SIGBUS on the staged corpus (the staged train split's tokens.bin truncated
in the run's scratch while the trainer is held, as an NFS hiccup or a cleaner does to a mapped file: its next read
of the mapping is a real SIGBUS; the supervisor finds the staged copy damaged and stages it again from
data.prepared), a SIGKILL of the trainer (MINILMD_FAULT), a SIGKILL of the supervisor (found through the run lock's
pid; window "run" starts it again, and it stops the orphaned trainer, which saves), a restart with scratch emptied
and the remote (NFS) gone while the supervisor is down (it waits in waiting_remote until the share is back), and
`minilmd stop` (the window ends with 0), then the launcher run again. The trainer's steps take milliseconds, so the
test acts on the run while it is held still: "pause@N" (tests/pausing_trainer.py) stops the trainer at step N until
the test sends SIGCONT or SIGKILL."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from chat_helpers import prepared_chat
from deploy_helpers import MINILMD, launcher  # noqa: F401 - a fixture
from fixture_cache import built_once
from held import PAUSING_TRAINER, pending, proc_state
from minilmd import checkpoint_dirs
from minilmd.config import load_config
from minilmd.daemon.host.lock import lock_holder
from minilmd.names import DPO_REFERENCE, FAULT_ENV, FAULTS_FIRED, SPLITS, STAGED_CORPUS, TOKENS, TRAINER_CMD_ENV
from reliability_helpers import event_texts
from supervisor_helpers import cli, env_for, events, state, step_of_state, write_config
from trainer_corpus import read_metrics, resumed_step
from waiting import wait_until

pytestmark = pytest.mark.slow  # five stages under tmux, the DPO stage's supervisor started four times: ~55 s

DPO_FAULTS = "pause@3,sigkill@6,pause@9,pause@13,pause@17"
DPO_STEPS = 20
LONG = 300  # a bound on each wait, never reached unless something is broken
DONE = "minilmd-tmux: minilmd run ended with exit status 0 (the run is done, or stopped on request): not restarted"


@pytest.fixture(scope="module")
def text_corpus(demo_jsonl, chat_tokenizer) -> tuple[Path, int]:
    """The pretraining corpus: demo_jsonl's plain text under the chat corpora's tokenizer (one vocabulary for all
    four stages)."""
    root = built_once("pipeline-text-corpus", lambda out: prepared_chat(demo_jsonl, chat_tokenizer, out / "corpus",
                                                                         data_format="text")) / "corpus"
    return root, int(json.loads((root / "meta.json").read_text())["vocab_size"])


def stage(tmp_path: Path, corpus, name: str, before: Path | None, steps: int, lora: dict | None = None,
          **train) -> Path:
    sections: dict = {"init": {"from": str(before)}} if before else {}
    if lora:
        sections["lora"] = lora
    return write_config(tmp_path, corpus, name=name, **sections,
                        train={"seq_len": 128, "micro_batch_size": 8, "max_steps": steps, "checkpoint_every": 2,
                               **train},
                        restart={"hang_timeout": "10m"})  # a paused trainer is held, never taken for hung


class Stage:
    def __init__(self, launcher, config: Path):
        self.launcher, self.config, self.cfg = launcher, config, load_config(config)
        self.run_dir, self.session = self.cfg.run_dir, f"minilmd-{self.cfg.run.name}"

    def launch(self, **env: str) -> None:
        out = self.launcher("--no-attach", str(self.config), MINILMD=str(MINILMD), MINILMD_TMUX_RESTART_SEC="1",
                            **env)
        assert out.returncode == 0, out.stdout + out.stderr

    def supervisor(self) -> int:
        return wait_until(lambda: (lock_holder(self.run_dir) or _NoHolder).pid, LONG, f"{self.session}'s supervisor")

    def trainer(self) -> int:
        return (state(self.run_dir).get("child") or {}).get("pid")

    def held(self, fault: str) -> int:
        """Wait until the trainer has stopped itself at `fault` (pause@N); its pid."""
        def stopped() -> int | None:
            fired = (self.run_dir / FAULTS_FIRED).read_text().split() if (self.run_dir / FAULTS_FIRED).exists() else []
            pid = self.trainer()
            return pid if fault in fired and pid and proc_state(pid) == "T" else None
        return wait_until(stopped, LONG, f"the trainer held at {fault}")

    def pane_pid(self) -> int:
        return next(pid for _, name, pid, _ in self.launcher.windows(self.session) if name == "run")

    def ended(self) -> str:
        """Wait until window run has ended; the last line its restart loop wrote."""
        wait_until(lambda: any(name == "run" and dead for _, name, _, dead in self.launcher.windows(self.session)),
                   LONG, f"window run of {self.session} to end")
        return self.launcher.last_word(self.session, "run")

    def end_all(self) -> None:
        """Teardown, after a failure too: the supervisor ignores the SIGHUP of tmux's kill-server, and a process
        SIGSTOPped here would outlive it."""
        pids = [self.trainer(), (lock_holder(self.run_dir) or _NoHolder).pid]
        try:
            pids.append(self.pane_pid())
        except (AssertionError, StopIteration):
            pass
        for pid in filter(None, pids):
            if self.ours(pid):  # a pid of a process that has ended may be another's by now
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def ours(self, pid: int) -> bool:
        """The process runs this stage: its command line names its config or its run directory's copy of it."""
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False
        return str(self.config) in command or str(self.run_dir) in command


class _NoHolder:
    pid = None


def gone(pid: int) -> bool:
    return proc_state(pid) in ("", "Z")


def final_checkpoint(cfg) -> Path:
    remote = Path(cfg.run.remote)
    return remote / checkpoint_dirs.read_latest(remote)


def test_four_stages_under_tmux_with_faults_in_dpo_finish_unattended_and_dpo_ends_bit_identical(
        tmp_path, launcher, text_corpus, chat_corpus, small_dpo_corpus):
    assert text_corpus[1] == chat_corpus[1] == small_dpo_corpus[1]
    pretrain = stage(tmp_path, text_corpus, "pretrain", None, 6, seq_len=64)
    sft = stage(tmp_path, chat_corpus, "sft", pretrain, 6)
    dpo_values = {"lr": 1e-3, "warmup_steps": 2}
    dpo = Stage(launcher, stage(tmp_path, small_dpo_corpus, "dpo", sft, DPO_STEPS, **dpo_values))
    straight = Stage(launcher, stage(tmp_path, small_dpo_corpus, "dpo-straight", sft, DPO_STEPS, **dpo_values))
    first_stages = [Stage(launcher, c) for c in (sft, pretrain)]
    dpo_env = {FAULT_ENV: DPO_FAULTS, TRAINER_CMD_ENV: f"{sys.executable} {PAUSING_TRAINER}"}
    lora = Stage(launcher, stage(tmp_path, small_dpo_corpus, "lora-dpo", sft, 8, {"rank": 4, "alpha": 8.0},
                                 **dpo_values))
    everyone = [dpo, straight, lora, *first_stages]
    try:
        straight.launch()  # later stages first; the tmux server starts with this call's environment: no faults
        dpo.launch(**dpo_env)
        lora.launch(**{FAULT_ENV: "sigkill@5"})  # LoRA DPO, the other fourth stage: adapters on the frozen SFT model
        for s in first_stages:
            s.launch()

        # 1: SIGBUS on the staged corpus: held at 3 (its step-3 rows not read yet), the staged train tokens cut to
        # nothing under the trainer's mapping; released, its first read of a row is a page the kernel cannot fill
        first = dpo.supervisor()
        trainer = dpo.held("pause@3")
        staged_tokens = dpo.cfg.scratch_dir / STAGED_CORPUS / SPLITS[0] / TOKENS
        full_size = staged_tokens.stat().st_size
        os.truncate(staged_tokens, 0)
        os.kill(trainer, signal.SIGCONT)
        # 2: the trainer's SIGKILL (MINILMD_FAULT), restarted by the supervisor
        orphan = dpo.held("pause@9")
        assert staged_tokens.stat().st_size == full_size  # staged again
        assert lock_holder(dpo.run_dir).pid == first  # the same supervisor survived both trainer faults
        # 3: SIGKILL of the supervisor, found through the run lock; window run starts it again
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: [e for e in events(dpo.run_dir) if e["event"] == "orphan" and e.get("pids") == [orphan]],
                   LONG, "the new supervisor to find the orphaned trainer")
        second = lock_holder(dpo.run_dir).pid
        assert second != first
        # the orphan event is written before the supervisor signals: released only once its SIGTERM is there
        wait_until(lambda: pending(orphan, signal.SIGTERM), LONG, "the new supervisor's SIGTERM to the orphan")
        os.kill(orphan, signal.SIGCONT)  # it got the new supervisor's SIGTERM while held: it saves and exits
        # 4: the remote gone at a restart: held at 13 with step 10 synced (step 12's save may be held half-written
        # with the trainer: it is written in the background). The supervisor is frozen first, so that window run,
        # waiting for it, starts none before all is ready: its trainer killed, scratch emptied (a reboot's
        # /dev/shm), the share away; then the supervisor is killed too. (Not window run's own process frozen:
        # tmux sends SIGCONT to a pane's process that stops.)
        trainer = dpo.held("pause@13")
        wait_until(lambda: ((state(dpo.run_dir).get("remote_checkpoint") or {}).get("step") or 0) >= 10, LONG,
                   "step 10 synced")
        os.kill(second, signal.SIGSTOP)
        wait_until(lambda: proc_state(second) == "T", LONG, "the supervisor frozen")
        os.kill(trainer, signal.SIGKILL)
        wait_until(lambda: gone(trainer), LONG, "the trainer gone")
        shutil.rmtree(dpo.cfg.scratch_dir)
        remote = Path(dpo.cfg.run.remote)
        away = tmp_path / "share" / "dpo-remote"
        away.parent.mkdir()
        remote.rename(away)
        attempts = len(list((dpo.run_dir / "logs").glob("attempt-*.log")))
        os.kill(second, signal.SIGKILL)
        wait_until(lambda: any("remote unavailable" in m for m in event_texts(dpo.run_dir, "fetch")), LONG,
                   "the restarted supervisor to wait for the remote")
        shown = wait_until(lambda: next((out for out in [cli("status", str(dpo.run_dir), fake=False).stdout]
                                         if "staging: waiting_remote" in out), None), LONG, "status: waiting_remote")
        assert "synced to it before" in shown, shown
        third = lock_holder(dpo.run_dir).pid
        assert third not in (first, second)
        assert len(list((dpo.run_dir / "logs").glob("attempt-*.log"))) == attempts  # no trainer from step 0
        away.rename(remote)
        # 5: `minilmd stop` while held at 17: the window ends with 0; the launcher run again finishes the run
        trainer = dpo.held("pause@17")
        stop = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "stop", str(dpo.run_dir)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_for())
        try:
            wait_until(lambda: state(dpo.run_dir).get("phase") == "stopping", LONG, "the supervisor to stop")
            os.kill(trainer, signal.SIGCONT)
            said = stop.communicate(timeout=LONG)[0]
        finally:
            if stop.poll() is None:
                stop.kill()
        assert stop.returncode == 0, said
        assert dpo.ended() == DONE
        ends = [e for e in events(dpo.run_dir) if e.get("new") == "done"]
        assert len(ends) == 1 and "stopped on request" in ends[0]["message"], ends  # stopped, not finished
        assert step_of_state(dpo.run_dir) < DPO_STEPS
        dpo.launch(**dpo_env)

        for s in everyone:
            assert s.ended() == DONE, s.session
            assert state(s.run_dir)["phase"] == "done", s.session
        assert step_of_state(dpo.run_dir) == step_of_state(straight.run_dir) == DPO_STEPS
        dpo_screen = dpo.launcher.screen(dpo.session, "run")
    finally:
        for s in everyone:
            s.end_all()

    # each fault fired, and was survived
    assert (dpo.run_dir / FAULTS_FIRED).read_text().split() == DPO_FAULTS.split(",")
    ends = [(e["cause"], e["exit"]) for e in events(dpo.run_dir) if e["event"] == "child_exit"]  # the orphan: none
    assert ends == [("sigbus", -signal.SIGBUS), ("killed", -signal.SIGKILL), ("stopped", 75), ("done", 0)], ends
    # the SIGBUS was the corpus's: the trainer died reading a row of it, the supervisor found the staged copy
    # damaged and staged it again before the next start
    logs = sorted((dpo.run_dir / "logs").glob("attempt-*.log"))
    crash = logs[0].read_text().partition("Fatal Python error: Bus error")[2]  # faulthandler: the stack it died in
    where = crash.partition("Current thread")[2].split("\n\n")[0]
    assert "plan/pairs.py" in where and "plan/bucketing.py" in where and "faults.py" not in where, crash
    died = event_texts(dpo.run_dir, "child_died")
    assert any("SIGBUS and the staged corpus fails verification: re-staging it" in m for m in died), died
    assert not any("verifies: restarting" in m for m in died), died
    damaged = [m for m in event_texts(dpo.run_dir, "staging") if "the staged corpus fails verification" in m]
    assert len(damaged) == 1 and f"{SPLITS[0]}/{TOKENS}: size 0 bytes" in damaged[0], damaged
    assert [e.get("transition") for e in events(dpo.run_dir)].count("restage") == 1
    restaged = [m for m in event_texts(dpo.run_dir, "info") if m.startswith("staging: copying 1 file(s)")]
    assert len(restaged) == 1 and f"from {dpo.cfg.data.prepared} " in restaged[0], restaged  # the damaged file
    assert dpo_screen.count("minilmd run was killed by SIGKILL (exit status 137)") == 2, dpo_screen
    resumed = [resumed_step(p.read_text()) for p in logs]
    # from the SFT model, ..., from the orphan's save on SIGTERM, from the remote's newest after the wait, from the
    # stop's save
    assert "SIGTERM received; saving at step 10" in logs[2].read_text()  # the orphan, held at 9, went on to 10
    # (the SIGBUS's restart from step 2, or from 0 when step 2's save was still being written in the background)
    assert resumed[0] is None and resumed[1] in (0, 2) and resumed[3:] in ([10, 10, 18], [10, 12, 18]), resumed
    stopped = [e["message"] for e in events(dpo.run_dir) if e.get("new") == "stopping"]
    assert [m for m in stopped if "stop requested; SIGTERM sent to trainer" in m] == stopped[:1], stopped
    # the reference computed once, at the first start, and read from the checkpoint by every later one (the one
    # after the remote's wait, from a checkpoint fetched into an empty scratch, too)
    assert [m["source"] for m in read_metrics(dpo.run_dir, "dpo_reference")] == ["computed"] + ["checkpoint"] * 5
    assert "init_ready" in [e.get("transition") for e in events(dpo.run_dir)]
    shown = cli("status", str(dpo.run_dir), fake=False).stdout
    lineage = next(line for line in shown.splitlines() if "lineage:" in line)
    assert "/sft/remote/step-00000006" in lineage and "<- " in lineage and "/pretrain/remote/" in lineage, shown

    # LoRA DPO: from the same SFT checkpoint, through its own trainer SIGKILL, the adapters alone with the reference
    assert [e["cause"] for e in events(lora.run_dir) if e["event"] == "child_exit"] == ["killed", "done"]
    adapters = final_checkpoint(lora.cfg)
    assert adapters.name == "step-00000008" and (adapters / DPO_REFERENCE).is_file()
    assert all("lora_" in k for k in load_file(adapters / "model.safetensors"))
    assert [m["source"] for m in read_metrics(lora.run_dir, "dpo_reference")] == ["computed", "checkpoint"]

    # bit-identical to the undisturbed DPO run (undisturbed indeed: no fault reached it through the tmux server)
    assert not (straight.run_dir / FAULTS_FIRED).exists()
    assert [e["cause"] for e in events(straight.run_dir) if e["event"] == "child_exit"] == ["done"]
    got, want = final_checkpoint(dpo.cfg), final_checkpoint(straight.cfg)
    assert got.name == want.name == f"step-{DPO_STEPS:08d}"
    for name in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(got / name), load_file(want / name)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), f"{name} differs from the undisturbed run's"
    assert (got / DPO_REFERENCE).read_bytes() == (want / DPO_REFERENCE).read_bytes()
