"""Helpers for the reliability tests and the soak: watchers that run beside a supervised run and record what must
never happen (a remote LATEST naming a checkpoint that does not validate, two trainers on one run), a corpus
big enough that a mapped read reaches new pages for many steps, and the fake trainer's undisturbed result.

The watchers are threads that poll; each keeps a list of violations that the test asserts empty at the end. A test
uses each as a context manager (`with RemoteWatcher(...) as watcher:`, or halts it in a `finally`): a watcher is
stopped when the test ends, passed or failed. One left polling goes on calling into the code during the next tests
of that pytest worker (its validations after a failed test were counted by another test's spy on
checkpoint.validate).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from minilmd import checkpoint, checkpoint_dirs, names, run_owner
from minilmd.config import load_config
from minilmd.daemon.base.runstate import process_environ
from supervisor_helpers import FAKE_TRAINER, env_for, write_config


class _Poller(threading.Thread):
    """A daemon thread that polls until halted; started by `with`, halted and joined when the block is left."""

    def __init__(self):
        super().__init__(daemon=True)
        self._halt = threading.Event()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.halt()

    def halt(self) -> None:
        self._halt.set()
        self.join(10)


class RemoteWatcher(_Poller):
    """Polls `<remote>/LATEST` (read on the real directory, not through a stalled mount) and strictly validates
    the checkpoint it names. A failed validation counts only if LATEST still names it afterwards (retention may
    legitimately delete the previous one right after LATEST moved on)."""

    def __init__(self, remote: Path, expected: checkpoint.Expectation | None = None, interval: float = 0.05):
        super().__init__()
        self.remote, self.expected, self.interval = Path(remote), expected, interval
        self.violations: list[str] = []
        self.seen: set[str] = set()
        self.checks = 0

    def latest(self) -> str | None:
        try:
            return (self.remote / names.LATEST).read_text().strip() or None
        except (FileNotFoundError, NotADirectoryError):
            return None

    def check_once(self) -> None:
        name = self.latest()
        if name is None:
            return
        try:
            checkpoint.validate(self.remote / name, self.expected)
            self.seen.add(name)
        except checkpoint.CheckpointError as e:
            if self.latest() == name:
                self.violations.append(f"LATEST names {name}, which does not validate: {'; '.join(e.problems[:3])}")
        self.checks += 1

    def run(self) -> None:
        while not self._halt.is_set():
            self.check_once()
            time.sleep(self.interval)

    def stop(self) -> list[str]:
        self.halt()
        self.check_once()
        return self.violations


def trainers_of(run_dir: Path) -> dict[str, list[int]]:
    """Live processes carrying MINILMD_RUN_DIR=<run dir>, by the launch id they inherited: one key per trainer
    launched (a torchrun trainer is several processes), whatever trainer.json says now."""
    target, found = str(Path(run_dir).resolve()), {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            env = process_environ(int(entry))
            if env.get(names.RUN_DIR_ENV) == target:
                found.setdefault(env.get(names.LAUNCH_ID_ENV, "?"), []).append(int(entry))
    return found


class TrainerCounter(_Poller):
    """Counts the trainers running for a run (trainers_of): never more than one may run on one run directory."""

    def __init__(self, run_dir: Path, interval: float = 0.05):
        super().__init__()
        self.run_dir, self.interval = Path(run_dir), interval
        self.max_seen = 0
        self.violations: list[str] = []

    def run(self) -> None:
        while not self._halt.is_set():
            trainers = trainers_of(self.run_dir)
            self.max_seen = max(self.max_seen, len(trainers))
            if len(trainers) > 1:
                self.violations.append(f"{len(trainers)} trainers at once on {self.run_dir}: {trainers}")
            time.sleep(self.interval)

    def stop(self) -> list[str]:
        self.halt()
        return self.violations


def fake_weights_of(ckpt: Path) -> int:
    return json.loads((Path(ckpt) / "trainer_state.json").read_text())["fake_weights"]


def undisturbed_fake_weights(config: Path) -> int:
    """The fake trainer's final weights for this config, run straight through without a supervisor (its own
    copy of the config with another run dir and scratch, so nothing of the real run is touched)."""
    cfg = load_config(config)
    tmp = Path(config).with_suffix(".undisturbed")
    text = Path(config).read_text(encoding="utf-8")
    text = text.replace(str(cfg.run_dir), str(tmp / "run")).replace(str(cfg.scratch_dir), str(tmp / "scratch"))
    if cfg.run.remote:
        text = text.replace(str(cfg.run.remote), str(tmp / "remote"))
    alone = tmp.with_suffix(".toml")
    alone.write_text(text, encoding="utf-8")
    (tmp / "run").mkdir(parents=True, exist_ok=True)
    env = env_for()
    out = subprocess.run([sys.executable, str(FAKE_TRAINER), "train", str(alone)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    newest = checkpoint_dirs.list_checkpoints(tmp / "scratch" / "checkpoints")[-1]
    return fake_weights_of(newest)


def remote_of_an_earlier_run(tmp_path: Path, corpus: Path, max_steps: int,
                             steps: tuple[str, ...] = ("step-00000010", "step-00000020")) -> tuple[Path, Path]:
    """A new machine's start: a run of `max_steps` (its config returned, with its remote) whose remote already
    holds `steps` of an earlier, undisturbed fake run to step 20 (keeping 5), LATEST naming the last; its scratch
    empty."""
    earlier = write_config(tmp_path, corpus, name="earlier", remote=False, train={"max_steps": 20, "keep_local": 5})
    undisturbed_fake_weights(earlier)
    made = earlier.with_suffix(".undisturbed") / "scratch" / "checkpoints"
    config = write_config(tmp_path, corpus, train={"max_steps": max_steps})
    remote = Path(load_config(config).run.remote)
    remote.mkdir(parents=True)
    for name in steps:
        shutil.copytree(made / name, remote / name)
    (remote / names.LATEST).write_text(steps[-1] + "\n")
    # the remote is the run's, claimed by its first sync on the old machine, whose run.dir was the same path (a
    # shared home: a run.dir of another path is another run to the claim, taken over with --claim-remote)
    claim = run_owner.record(load_config(config).run_dir, load_config(config).run.name)
    (remote / names.REMOTE_OWNER).write_bytes(run_owner.encode(claim))
    return config, remote


def expectation_for(config: Path) -> checkpoint.Expectation:
    from minilmd.corpus.format import open_prepared

    cfg = load_config(config)
    corpus = open_prepared(cfg.data.prepared)
    return checkpoint.Expectation(cfg.model_dict(), corpus.data_fingerprint, corpus.tokenizer_fingerprint)


def copy_corpus(corpus: Path, dest: Path) -> Path:
    shutil.copytree(corpus, dest)
    return dest


def event_texts(run_dir: Path, kind: str | None = None) -> list[str]:
    from supervisor_helpers import events

    return [e.get("message", "") for e in events(run_dir) if kind is None or e.get("event") == kind]
