"""The supervisor against tests/fake_trainer.py: real processes, real signals, real files, fast.

Each test runs `minilmd run` as a process and reads what it leaves: state.json, events.jsonl, the remote. The fake
trainer's "weights" are a hash chain over the tokens it read, so an interrupted run must end with the same value as
the fake trainer run straight through.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from minilmd import checkpoint, checkpoint_dirs
from minilmd.config import load_config
from minilmd.protocol import EXIT_DATA, SUPERVISOR_CONFIG, SUPERVISOR_GAVE_UP
from reliability_helpers import fake_weights_of
from supervisor_helpers import (
    cli,
    env_for,
    events,
    run_supervisor,
    start_supervisor,
    state,
    step_of_state,
    transitions,
    wait_for,
    write_config,
)


def final_weights(config: Path) -> int:
    return fake_weights_of(checkpoint_dirs.list_checkpoints(load_config(config).checkpoint_dir)[-1])


@pytest.mark.slow
def test_full_run_from_waiting_to_done_leaves_a_valid_remote_latest(tmp_path, corpus, fake_undisturbed_weights):
    config = write_config(tmp_path, corpus)
    cfg = load_config(config)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(0)

    assert run_supervisor(config, tmp_path, NOTIFY_SOCKET=str(tmp_path / "notify.sock")) == 0

    assert transitions(cfg.run_dir) == ["staging", "starting", "training", "stopping", "done"]
    st = state(cfg.run_dir)
    assert st["phase"] == "done" and st["outcome"]["exit"] == 0 and st["restarts"] == []
    assert st["progress"]["step"] == 30 and st["progress"]["total_steps"] == 30
    remote = Path(cfg.run.remote)
    assert checkpoint_dirs.read_latest(remote) == "step-00000030"
    checkpoint.validate(remote / "step-00000030")
    assert st["remote_checkpoint"]["step"] == 30 and st["remote_checkpoint"]["verified"]
    assert final_weights(config) == fake_undisturbed_weights
    messages = []
    while True:
        try:
            messages.append(notify.recv(4096).decode())
        except BlockingIOError:
            break
    assert any("READY=1" in m for m in messages) and any("STATUS=s: done" in m for m in messages)


@pytest.mark.slow
def test_sigbus_from_a_truncated_staged_corpus_restages_and_finishes_identically(tmp_path, corpus,
                                                                                    fake_undisturbed_weights):
    config = write_config(tmp_path, corpus)
    cfg = load_config(config)
    proc = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.1")
    wait_for(lambda: step_of_state(cfg.run_dir) >= 5, 60, "training to reach step 5")
    staged_tokens = cfg.scratch_dir / "corpus" / "train" / "tokens.bin"
    os.truncate(staged_tokens, 0)  # what NFS losing the file does to a mapping: the next page fault is a SIGBUS
    assert proc.wait(120) == 0
    st = state(cfg.run_dir)
    assert [r["cause"] for r in st["restarts"]] == ["sigbus"]
    assert st["restarts"][0]["action"] == "restage" and st["restarts"][0]["exit"] == -signal.SIGBUS
    assert transitions(cfg.run_dir).count("staging") == 2
    assert staged_tokens.stat().st_size > 0
    assert final_weights(config) == fake_undisturbed_weights


@pytest.mark.slow
def test_sigkill_mid_run_resumes_from_the_last_checkpoint(tmp_path, corpus, fake_undisturbed_weights):
    config = write_config(tmp_path, corpus)
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, MINILMD_FAULT="sigkill@15") == 0
    st = state(cfg.run_dir)
    assert [(r["cause"], r["exit"], r["action"]) for r in st["restarts"]] == [("killed", -9, "restart")]
    assert st["restarts"][0]["detail"].endswith("(injected by MINILMD_FAULT: sigkill@15)"), st["restarts"][0]
    second = (cfg.run_dir / "logs" / "attempt-0002.log").read_text()
    assert "resuming at step 10" in second
    assert final_weights(config) == fake_undisturbed_weights


@pytest.mark.slow
def test_cuda_oom_halves_the_micro_batch_and_keeps_the_global_batch(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"micro_batch_size": 32, "grad_accum": 1})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, FAKE_OOM_ABOVE_MB="8") == 0
    st = state(cfg.run_dir)
    assert [r["cause"] for r in st["restarts"]] == ["cuda_oom", "cuda_oom"]
    assert st["overrides"] == {"train.micro_batch_size": 8, "train.grad_accum": 4}
    lines = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [x for x in lines if x["kind"] == "train"]
    assert trained and all(x["micro_batch_size"] * x["grad_accum"] == 32 for x in trained)
    assert any("micro_batch_size 16 -> 8, grad_accum 2 -> 4" in e["message"] for e in events(cfg.run_dir))


@pytest.mark.slow
def test_a_hang_is_detected_and_the_trainer_killed(tmp_path, corpus, fake_undisturbed_weights):
    config = write_config(tmp_path, corpus, restart={"hang_timeout": "1.5s", "backoff_initial": "0.1s"})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, MINILMD_FAULT="hang@12") == 0
    st = state(cfg.run_dir)
    assert [r["cause"] for r in st["restarts"]] == ["hang"]
    assert "no heartbeat" in st["restarts"][0]["detail"]
    assert final_weights(config) == fake_undisturbed_weights


@pytest.mark.slow
def test_a_config_error_is_final_without_restarts(tmp_path, corpus):
    config = write_config(tmp_path, corpus)
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, MINILMD_FAULT="nonsense@3") == SUPERVISOR_CONFIG
    st = state(cfg.run_dir)
    assert st["phase"] == "failed" and st["restarts"] == []
    assert len(list((cfg.run_dir / "logs").glob("attempt-*.log"))) == 1
    assert "config error" in st["last_error"]


@pytest.mark.slow
def test_a_source_that_is_not_a_corpus_is_a_final_data_error(tmp_path, corpus):
    bogus = tmp_path / "bogus"
    bogus.mkdir()
    (bogus / "meta.json").write_text('{"format": "something else"}')
    config = write_config(tmp_path, (bogus, corpus[1]))
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path) == EXIT_DATA
    assert state(cfg.run_dir)["phase"] == "failed"
    assert not (cfg.run_dir / "logs" / "attempt-0001.log").exists()


@pytest.mark.slow
def test_restarts_without_progress_give_up_with_status_79(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"micro_batch_size": 1},
                          restart={"no_progress_limit": 3, "backoff_initial": "0.05s"})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, FAKE_OOM_ABOVE_MB="0") == SUPERVISOR_GAVE_UP
    st = state(cfg.run_dir)
    assert st["phase"] == "failed" and "3 attempts in a row without a new checkpoint" in st["last_error"]
    assert len(st["restarts"]) == 2  # the third death is the one that gives up


@pytest.mark.slow
@pytest.mark.parametrize("keep_scratch", [False, True])
def test_a_run_that_fails_for_good_gives_its_staged_corpus_back_and_keeps_its_checkpoints(tmp_path, corpus,
                                                                                          keep_scratch):
    """A final failure (79 here) after checkpoints: on main the staged corpus stayed in /dev/shm until its user came
    back, days of RAM held from the machine's other users. The corpus goes (a copy of what is on the share), the
    checkpoints stay (the newest may not be synced); run.keep_scratch keeps it all."""
    config = write_config(tmp_path, corpus, remote=False, run={"keep_scratch": keep_scratch}, train={"max_steps": 20})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path) == 0
    kept = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)
    longer = write_config(tmp_path, corpus, remote=False, run={"keep_scratch": keep_scratch}, train={"max_steps": 40},
                          restart={"no_progress_limit": 2, "backoff_initial": "0.05s"})
    assert run_supervisor(longer, tmp_path, FAKE_OOM_ABOVE_MB="0") == SUPERVISOR_GAVE_UP
    assert kept and checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir) == kept
    assert (cfg.scratch_dir / "corpus").is_dir() == keep_scratch
    released = [e["message"] for e in events(cfg.run_dir) if e.get("event") == "scratch" and "failed" in e["message"]]
    assert bool(released) != keep_scratch, released


@pytest.mark.slow
def test_a_run_that_fails_for_good_keeps_the_staged_corpus_it_trained_from_while_its_share_was_gone(tmp_path,
                                                                                                    corpus):
    """The last staging trained from the verified copy in scratch because the corpus's share was gone; then the run
    failed for good (79). On main that copy was given back too, the only one within reach, and the next start had
    to wait for the share; now it stays, and the events say why."""
    share = shutil.copytree(corpus[0], tmp_path / "share" / "corpus")
    config = write_config(tmp_path, (share, corpus[1]), remote=False, run={"keep_scratch": False},
                          train={"max_steps": 20})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path) == 0  # no remote: its scratch stays (the only copy of its checkpoints)
    os.rename(tmp_path / "share", tmp_path / "share.gone")
    longer = write_config(tmp_path, (share, corpus[1]), remote=False, run={"keep_scratch": False},
                          train={"max_steps": 40},
                          restart={"no_progress_limit": 2, "backoff_initial": "0.05s"})
    assert run_supervisor(longer, tmp_path, FAKE_OOM_ABOVE_MB="0") == SUPERVISOR_GAVE_UP
    out = (tmp_path / "supervisor.out").read_text()
    assert "training from its verified copy" in out, out[-3000:]
    assert (cfg.scratch_dir / "corpus" / "meta.json").is_file()
    said = [e["message"] for e in events(cfg.run_dir) if e.get("event") == "scratch"]
    assert any("kept the staged corpus" in m and "not there (its share gone?)" in m for m in said), said


@pytest.mark.slow
def test_a_run_that_fails_for_good_after_its_share_went_keeps_the_staged_corpus(tmp_path, corpus):
    """The last staging read the corpus from its share; the share went while the trainer ran, then the run failed
    for good (79). The staged copy is the only one within reach now: it stays, and the events say why."""
    share = shutil.copytree(corpus[0], tmp_path / "share" / "corpus")
    config = write_config(tmp_path, (share, corpus[1]), remote=False, run={"keep_scratch": False},
                          train={"max_steps": 40}, restart={"no_progress_limit": 2, "backoff_initial": "0.05s"})
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, FAKE_OOM_ABOVE_MB="0", FAKE_SHARE_GOES=str(tmp_path / "share")) == \
        SUPERVISOR_GAVE_UP
    assert not (tmp_path / "share").exists() and (tmp_path / "share.gone").is_dir()
    assert "training from its verified copy" not in (tmp_path / "supervisor.out").read_text()
    assert (cfg.scratch_dir / "corpus" / "meta.json").is_file()
    said = [e["message"] for e in events(cfg.run_dir) if e.get("event") == "scratch"]
    assert any("kept the staged corpus" in m and "data.prepared is not there now" in m for m in said), said


@pytest.mark.slow
def test_a_remote_checkpoint_of_another_corpus_is_refused_with_the_trainers_status(tmp_path, corpus):
    """The run's config pointed at another corpus after its scratch went: the newest remote checkpoint, fetched at
    staging, was trained on other data. On main staging ended that with 2 where the trainer's own refusal of the
    same checkpoint is 65 (docs/failure-modes.md); now both say 65, and nothing on the remote is moved. The corpus is
    behind a URL here: the launch's own look (daemon/jobs/resumefrom.py) cannot compare a corpus not staged yet, and a
    local one it refuses before anything starts (tests/test_check_resume.py). The fetch says it in `run --check`'s
    words, never its class name nor its temporary copy in scratch."""
    from trainer_corpus import synthetic_prepared

    config = write_config(tmp_path, corpus)
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path) == 0
    shutil.rmtree(cfg.scratch_dir)  # a reboot emptied /dev/shm
    remote = sorted(p.name for p in Path(cfg.run.remote).iterdir())
    other = synthetic_prepared(tmp_path / "other-corpus", corpus[0] / "tokenizer.json", corpus[1])
    assert run_supervisor(write_config(tmp_path, (f"file://{other}", corpus[1])), tmp_path) == EXIT_DATA
    said = state(cfg.run_dir)["last_error"]
    assert f"this run's checkpoints (step 30, on the remote {cfg.run.remote}) were trained with another corpus " \
           f"than the corpus data.prepared names now (data fingerprint " in said, said
    assert "CheckpointMismatch" not in said and ".tmp-" not in said, said
    assert sorted(p.name for p in Path(cfg.run.remote).iterdir()) == remote


@pytest.mark.slow
def test_stop_leaves_a_synced_checkpoint(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 100000, "checkpoint_every": 1000})
    cfg = load_config(config)
    proc = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.05")
    wait_for(lambda: step_of_state(cfg.run_dir) >= 5, 60, "training")
    out = cli("stop", str(cfg.run_dir), timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert proc.wait(60) == 0
    st = state(cfg.run_dir)
    assert st["phase"] == "done" and st["outcome"]["exit"] == 0
    newest = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    assert checkpoint.step_of(newest) >= 5
    assert checkpoint_dirs.read_latest(cfg.run.remote) == newest.name
    checkpoint.validate(Path(cfg.run.remote) / newest.name)
    assert f"remote checkpoint step {checkpoint.step_of(newest)} (verified)" in out.stdout


@pytest.mark.slow
def test_a_second_supervisor_is_refused_and_says_who_owns_the_run(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 100000})
    cfg = load_config(config)
    proc = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.05")
    try:
        wait_for(lambda: state(cfg.run_dir).get("phase") == "training", 60, "training")
        second = cli("run", str(config), timeout=30)
        assert second.returncode == SUPERVISOR_CONFIG
        assert f"pid {proc.pid}" in second.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.mark.slow
def test_a_restarted_supervisor_stops_the_orphaned_trainer_first(tmp_path, corpus, fake_undisturbed_weights):
    config = write_config(tmp_path, corpus)
    cfg = load_config(config)
    # steps slow enough that the orphan still trains while the second supervisor starts (it executes itself once
    # more to carry its identity, procs.carry_supervisor_identity): the orphan inherits FAKE_STEP_S
    first = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.5")
    wait_for(lambda: step_of_state(cfg.run_dir) >= 3, 60, "training")
    orphan = state(cfg.run_dir)["child"]["pid"]
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert Path(f"/proc/{orphan}").exists()  # the trainer outlived its supervisor
    second = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.1")
    assert second.wait(120) == 0
    evs = events(cfg.run_dir)
    orphan_events = [e for e in evs if e["event"] == "orphan"]
    assert orphan_events and orphan_events[0]["pids"] == [orphan]
    gone_at = orphan_events[-1]["time"]
    launches = [e for e in evs if e.get("new") == "starting"]
    assert launches[-1]["time"] >= gone_at and launches[-1]["pid"] != orphan
    assert final_weights(config) == fake_undisturbed_weights


def test_status_logs_and_stop_on_a_directory_that_is_not_a_run(tmp_path):
    for command in (["status"], ["logs"], ["stop"]):
        out = cli(*command, str(tmp_path), timeout=30)
        assert out.returncode == 2
        assert "not a minilmd run directory" in out.stderr
        assert f"e.g. `minilmd {command[0]} /path/to/run`" in out.stderr  # the command given, not always status


@pytest.mark.slow
def test_status_while_running_and_after_the_end(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 60})
    cfg = load_config(config)
    release = tmp_path / "release"  # held at step 3 while status looks: still training however loaded the machine
    proc = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.05", FAKE_HOLD=f"3:{release}")
    follower = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "logs", str(cfg.run_dir), "-f"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_for())
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(follower.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: step_of_state(cfg.run_dir) >= 3, 60, "training")
        live = cli("status", str(cfg.run_dir))
        assert live.returncode == 0
        assert "training" in live.stdout and f"supervisor pid {proc.pid} running" in live.stdout
        assert "/60" in live.stdout
        as_json = json.loads(cli("status", str(cfg.run_dir), "--json").stdout)
        assert as_json["running"] is True and as_json["state"]["phase"] == "training"
        release.touch()
        assert proc.wait(60) == 0
        assert follower.wait(60) == 0  # the run it followed has ended: so does `logs -f`, by itself
    finally:
        if follower.poll() is None:
            follower.send_signal(signal.SIGINT)
            follower.wait(10)
        reader.join(10)
    followed = "".join(lines)
    assert followed.rstrip().endswith("the run has ended (done, exit 0)"), followed[-2000:]
    after = cli("status", str(cfg.run_dir))
    assert "done" in after.stdout and "not running (ended" in after.stdout and "exit 0" in after.stdout
    assert "[supervisor]" in followed and "stopping -> done" in followed
    assert "done at step 60" in followed  # the trainer's own output, followed live


def test_run_check_validates_only(tmp_path, corpus):
    good = write_config(tmp_path, corpus)
    cfg = load_config(good)
    out = cli("run", str(good), "--check")
    assert out.returncode == 0 and "OK" in out.stdout
    bad = write_config(tmp_path, corpus, name="bad", train={"max_steps": 0, "seq_len": 100000, "bogus": 1})
    out = cli("run", str(bad), "--check")
    assert out.returncode == 2
    assert "train.bogus" in out.stderr and "a budget is required" in out.stderr and "seq_len" in out.stderr
    assert not cfg.run_dir.exists() and not load_config(good).scratch_dir.exists()  # nothing created
