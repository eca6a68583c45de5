"""Helpers for the supervisor's tests: a tiny run config, a supervisor as a real process, waiting on its files."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import trainer_corpus
from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.child.process import TRAINER_CMD_ENV
from minilmd.fsio import atomic_write_json
from minilmd.names import FAULT_ENV
from trainer_corpus import ONE_LAYER_MODEL
from waiting import wait_until

FAKE_TRAINER = Path(__file__).with_name("fake_trainer.py")
QUICK_CLI = Path(__file__).with_name("quick_cli.py")
READS_THE_SAME = {"TEST_READ_AGAIN_AFTER_S": "0.1,0.1"}
"""start_supervisor's `quick` for a run whose remote checkpoints are damaged for good: each reads the same at every
read, however long the pauses before it is read again (daemon/jobs/fetch.py READ_AGAIN_AFTER_S, 2 s and 5 s in use:
7 s a checkpoint, for nothing). A test of a damage that passes (a short read of a moment) keeps the pauses in use."""
COPIES_THE_SAME = {"TEST_STAGING_COPY_FIRST_S": "0.1"}
"""start_supervisor's `quick` for a run whose corpus source is damaged for good: each copy of the file reads the same,
however long the pauses before it is copied again (minilmd/backoff.py STAGING_COPY_FIRST_S, 1 + 2 + 4 s in use)."""
BASELINE = {"train": {"max_steps": 16, "checkpoint_every": 4, "micro_batch_size": 4, "grad_accum": 2}}
"""The real-trainer run that conftest's `undisturbed` fixture trains once per session (write_config(...,
**BASELINE), no remote): a disturbed run written with the same sections must end with its weights, bit for bit."""


def write_config(tmp: Path, corpus: tuple[Path, int], name: str = "s", remote: bool = True, **sections) -> Path:
    """trainer_corpus.write_config with the supervisor's defaults: the one-layer model, 30 steps with a checkpoint
    every 10, a remote, fast sync and backoff; sections={"train": {...}} override them."""
    body = {
        "data": {"val_windows": 4},
        "model": dict(ONE_LAYER_MODEL),
        "train": {"seq_len": 32, "micro_batch_size": 4, "grad_accum": 1, "max_steps": 30, "checkpoint_every": 10,
                  "keep_local": 2},
        "sync": {"every": "1s", "keep": 2},
        "restart": {"backoff_initial": "0.1s", "backoff_max": "0.5s", "hang_timeout": "30s"},
    }
    if remote:
        body["run"] = {"remote": str(tmp / name / "remote")}
    for section, values in sections.items():
        body.setdefault(section, {}).update(values)
    return trainer_corpus.write_config(tmp, corpus, name, **body)


def env_for(fake: bool = True, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, TRAINER_CMD_ENV, "NOTIFY_SOCKET")}
    env["OMP_NUM_THREADS"] = "1"
    if fake:
        env[TRAINER_CMD_ENV] = f"{sys.executable} {FAKE_TRAINER}"
    env.update(extra)
    return env


def cli(*args: str, timeout: float = 60, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env_for(**env))


def start_supervisor(config: Path, log: Path, fake: bool = True, quick: dict[str, str] | None = None,
                     **extra_env) -> subprocess.Popen:
    """`minilmd run config` in a process of its own, its output appended to `log`; with `quick` (tests/quick_cli.py's
    variables), through quick_cli, whose supervisor waits those waits shorter."""
    out = open(log, "ab")
    cli = [str(QUICK_CLI)] if quick else ["-m", "minilmd.cli"]
    return subprocess.Popen([sys.executable, *cli, "run", str(config)], stdout=out, stderr=subprocess.STDOUT,
                            env=env_for(fake, **extra_env, **(quick or {})))


def wait_or_kill(proc: subprocess.Popen, timeout: float = 120) -> int:
    """The exit status of proc; a proc still running after timeout is killed (and the wait raises)."""
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_supervisor(config: Path, tmp: Path, timeout: float = 120, fake: bool = True,
                   quick: dict[str, str] | None = None, **extra_env) -> int:
    return wait_or_kill(start_supervisor(config, tmp / "supervisor.out", fake, quick, **extra_env), timeout)


def synced_steps_10_and_20(tmp: Path, corpus: tuple[Path, int], then: int) -> tuple[Path, object, Path]:
    """A run whose remote holds step 10 and step 20 (two supervised runs of the fake trainer, sync.keep 2): the config
    that trains it on to step `then`, that config loaded, and the remote."""
    for steps in (10, 20):
        config = write_config(tmp, corpus, train={"max_steps": steps})
        assert run_supervisor(config, tmp) == 0, (tmp / "supervisor.out").read_text()[-3000:]
    config = write_config(tmp, corpus, train={"max_steps": then})
    cfg = load_config(config)
    return config, cfg, Path(cfg.run.remote)


def train_undisturbed(tmp: Path, corpus: Path, **changes) -> Path:
    """Run the real trainer straight through, without a supervisor or a remote; its last checkpoint, to compare
    a disturbed run's final weights against. In this process (in_process.py): nothing disturbs it, and a new
    Python's imports cost about 3 CPU-s for each run each pytest worker makes."""
    from in_process import train_in_process  # torch: not for the modules that import this one without a trainer
    from minilmd import checkpoint_dirs
    from minilmd.config import load_config

    plain = load_config(write_config(tmp, corpus, name="plain", remote=False, **changes))
    plain.run_dir.mkdir(parents=True)
    out = train_in_process(Path(plain.source))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return checkpoint_dirs.list_checkpoints(plain.checkpoint_dir)[-1]


def state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "state.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def events(run_dir: Path) -> list[dict]:
    try:
        text = (run_dir / "events.jsonl").read_text()
    except FileNotFoundError:
        return []
    lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]  # a line being appended: not yet
    return [json.loads(line) for line in lines]


def transitions(run_dir: Path) -> list[str]:
    return [e["new"] for e in events(run_dir) if "new" in e]


wait_for = wait_until  # the name these tests have always used


def remove_while_written(directory: Path, timeout: float = 60) -> None:
    """A user's `rm -r` of a directory that live processes still write into (the trainer replaces its heartbeat at
    every step, the supervisor its state.json): one rmtree can meet a file made after it listed the directory
    (rmdir: ENOTEMPTY; under load it did) or one gone before it got there (ENOENT). Tried again until the directory
    is gone, as the user would; once it is, their writes by path fail and make nothing again."""
    def gone() -> bool:
        shutil.rmtree(directory, ignore_errors=True)
        return not os.path.lexists(directory)

    wait_until(gone, timeout, f"{directory} to be removed", interval=0.01)


def step_of_state(run_dir: Path) -> int:
    return (state(run_dir).get("progress") or {}).get("step") or 0


def logged_run(where: Path, steps: int) -> Path:
    """where/run as a trainer leaves a finished run of `steps` steps: state.json and metrics.jsonl (what plot and
    status draw)."""
    from minilmd import names

    run_dir = where / "run"
    run_dir.mkdir()
    (run_dir / names.STATE).write_text(json.dumps({"run": "r"}))
    (run_dir / names.METRICS).write_text("".join(json.dumps(
        {"kind": "train", "step": s, "tokens_seen": s * 128, "loss": 5.0 - s / 10, "lr": 1e-3, "grad_norm": 1.0,
         "tok_s": 500.0, "time": 1000.0 + s}) + "\n" for s in range(1, steps + 1)))
    return run_dir


def run_whose_step_1_records(tmp: Path, corpus: tuple[Path, int], init: dict, name: str = "s",
                             remote: bool = True):
    """(config, its RunConfig): a run directory, its config copied in as a launch leaves it, whose only checkpoint,
    step 1, records `init` as what it started from (another run's word, in its trainer_state.json)."""
    import shutil

    from minilmd import names
    from minilmd.config import load_config

    config = write_config(tmp, corpus, name=name, remote=remote)
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    shutil.copyfile(config, cfg.run_dir / names.RUN_CONFIG_COPY)
    own = cfg.checkpoint_dir / names.step_name(1)
    own.mkdir(parents=True)
    (own / names.MANIFEST).write_text(json.dumps({"step": 1, "files": {}}))
    (own / names.TRAINER_STATE).write_text(json.dumps({"step": 1, "init": init}))
    return config, cfg


def ended_run(run_dir: Path) -> Path:
    """A run directory whose supervisor (a pid long gone) ended `done`: what the views read, no process behind it."""
    run_dir.mkdir(parents=True)
    st = new_state("tiny", run_dir, "tiny.toml")
    st.update(phase="done", supervisor={"pid": 999999, "start_ticks": 1, "host": "h"},
              outcome={"exit": 0, "phase": "done", "time": time.time(), "reason": "the run finished"})
    atomic_write_json(run_dir / names.STATE, st)
    (run_dir / names.SUPERVISOR_LOG).write_text("the supervisor's line\n")
    return run_dir


def model_sha(ckpt: Path) -> str:
    """The sha256 a checkpoint's manifest lists for its weights: two checkpoints with the same one hold the same
    model, bit for bit."""
    return json.loads((ckpt / names.MANIFEST).read_text())["files"][names.MODEL_FILE]["sha256"]


def remote_step(run_dir: Path) -> int:
    """The step state.json records synced to run.remote (0: none yet)."""
    return (state(run_dir).get("remote_checkpoint") or {}).get("step") or 0


def wait_for_synced(run_dir: Path, step: int, proc, out: Path, timeout: float = 180) -> None:
    """Until state.json records `step` synced, or the supervisor `proc` has ended; a timeout says what the
    supervisor's output (`out`) ended with, so that a run slowed by load tells where it stood."""
    try:
        wait_for(lambda: remote_step(run_dir) == step or proc.poll() is not None, timeout, f"step {step} synced")
    except AssertionError as e:
        said = out.read_text(errors="replace")[-3000:] if out.exists() else "(no output)"
        raise AssertionError(f"{e}; state.json's remote step {remote_step(run_dir)}; the supervisor's output "
                             f"ends:\n{said}") from None


LAUNCHES = {"staged", "restart", "space_freed"}
"""The transitions that launch a trainer (daemon/base/states.py)."""


def launches_after_last_start(run_dir: Path) -> list[dict]:
    """The trainer launches of the last supervisor that started in run_dir."""
    seen = events(run_dir)
    last = max(i for i, e in enumerate(seen) if e["event"] == "start")
    return [e for e in seen[last:] if e["event"] in LAUNCHES]


def stop_cli(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", "stop", str(run_dir)], capture_output=True,
                          text=True, timeout=300, env=env_for())
