"""Which records say a run synced to its remote before (daemon/jobs/remotewait.py), as `minilmd run --check` says
it for a run whose scratch holds no checkpoint and whose remote is out of reach:

- records that cannot be read (events.jsonl not a regular file, a corrupt state.json) make the run wait, saying so,
  not start from step 0 as a run that never synced (on main: "this run has never synced to it");
- a record counts only when it names the current run.remote: a run pointed at a new empty directory starts from
  step 0 (on main: it waited forever, "synced to it before", for the old remote's step);
- records before the last `run --fresh` start are another lineage's (on main: the step state.json forgot on
  `--fresh` was still read back from events.jsonl, and the next restart waited).

The supervisor decides with the same function (tests/test_remote_wait.py).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.jobs import remotewait
from minilmd.fsio import atomic_write_json
from supervisor_helpers import cli, write_config


def run_without_scratch(tmp_path: Path, corpus) -> tuple[Path, object]:
    """A run's config and its run directory, scratch holding nothing and run.remote not there."""
    config = write_config(tmp_path, corpus)
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    return config, cfg


def write_events(cfg, *records: dict) -> None:
    (cfg.run_dir / names.EVENTS).write_text("".join(json.dumps({"time": time.time(), "message": "m", **rec}) + "\n"
                                                    for rec in records))


def write_state(cfg, remote_checkpoint: dict | None) -> None:
    body = new_state(cfg.run.name, cfg.run_dir, str(cfg.source))
    body.update(phase="stopped", remote_checkpoint=remote_checkpoint)
    atomic_write_json(cfg.run_dir / names.STATE, body)


def check(config: Path, *flags: str) -> str:
    out = cli("run", "--check", str(config), *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_an_events_file_that_cannot_be_read_makes_the_run_wait_saying_so(tmp_path, corpus):
    config, cfg = run_without_scratch(tmp_path, corpus)
    (cfg.run_dir / names.EVENTS).mkdir()  # not a regular file: whatever it held cannot be read
    said = check(config)
    assert f"waits: run.remote: {cfg.run.remote} is not there (its share gone?), and this run's records cannot be " \
           f"read (events.jsonl a directory): it may have synced to it before" in said, said
    assert "`minilmd run --fresh` starts from step 0 instead" in said, said


def test_a_corrupt_state_file_makes_the_run_wait_saying_so(tmp_path, corpus):
    config, cfg = run_without_scratch(tmp_path, corpus)
    (cfg.run_dir / names.STATE).write_text('{"remote_checkpoint": {"step": 20, "pa')  # torn, with no events
    said = check(config)
    assert f"waits: run.remote: {cfg.run.remote} is not there (its share gone?), and this run's records cannot be " \
           f"read (state.json " in said and "never synced" not in said, said


@pytest.mark.slow  # two `run --check`s
def test_records_of_another_remote_do_not_make_the_run_wait(tmp_path, corpus):
    config, cfg = run_without_scratch(tmp_path, corpus)
    old = str(tmp_path / "old-share" / "remote")
    write_state(cfg, {"step": 20, "time": time.time(), "verified": True, "path": f"{old}/step-00000020"})
    write_events(cfg, {"event": "sync", "step": 20, "verified": True, "remote": old},
                 {"event": "fetch", "step": 20, "remote": old})
    Path(cfg.run.remote).mkdir(parents=True)  # run.remote now a new, empty directory
    refused = cli("run", "--check", str(config))  # a step 0 over the old remote's timeline: tests/test_run_identity.py
    assert refused.returncode == 2 and f"records step 20 synced to {old}" in refused.stderr, refused.stderr
    said = check(config, "--fresh")
    assert f"starts from step 0: run.remote: {cfg.run.remote} is an empty directory" in said and "waits" not in \
        said and "synced to it before" not in said, said


def test_records_of_the_current_remote_still_make_the_run_wait(tmp_path, corpus):
    config, cfg = run_without_scratch(tmp_path, corpus)
    write_events(cfg, {"event": "sync", "step": 20, "verified": True, "remote": cfg.run.remote + "/"})
    said = check(config)
    assert "this run has synced to it before (events.jsonl records step 20 synced to or fetched from it)" in said, \
        said


@pytest.mark.slow  # three `run --check`s
def test_records_before_a_fresh_start_are_another_lineages(tmp_path, corpus):
    config, cfg = run_without_scratch(tmp_path, corpus)
    write_state(cfg, None)  # `--fresh` forgot the remote step; the run was stopped before its first sync
    write_events(cfg, {"event": "sync", "step": 20, "verified": True, "remote": cfg.run.remote},
                 {"event": "fetch", "remote": cfg.run.remote, "lineage": "fresh"})
    said = check(config)
    assert "starts from step 0: run.remote:" in said and "this run has never synced to it" in said, said
    write_events(cfg, {"event": "sync", "step": 20, "verified": True, "remote": cfg.run.remote},
                 {"event": "fetch", "remote": cfg.run.remote, "lineage": "fresh"},
                 {"event": "sync", "step": 5, "verified": True, "remote": cfg.run.remote})
    assert "this run has synced to it before (events.jsonl records step 5 synced" in check(config)


@pytest.mark.parametrize("cut", [False, True])
def test_a_line_too_long_is_skipped_without_being_read_whole(tmp_path, cut):
    """A line past EVENTS_MAX_LINE is read in bounded pieces and skipped; the records after it count."""
    sync = json.dumps({"event": "sync", "step": 7, "remote": "/nfs/r"}).encode()
    long = b'{"step": 99, "event": "sync", "remote": "/nfs/r", "pad": "' + b"x" * (3 * remotewait.EVENTS_MAX_LINE)
    (tmp_path / names.EVENTS).write_bytes(long + (b"" if cut else b'"}\n' + sync + b"\n"))
    assert remotewait.read_events(tmp_path, "/nfs/r") == (None if cut else 7, "")


def test_an_events_file_of_another_user_is_not_read(tmp_path):
    events = tmp_path / names.EVENTS
    events.write_text(json.dumps({"event": "sync", "step": 7, "remote": "/nfs/r"}) + "\n")
    os.chown(events, 12345, 12345) if os.geteuid() == 0 else pytest.skip("needs root to give a file away")
    found = remotewait.records("/nfs/r", tmp_path, None)
    assert found.verdict == "unknown" and found.why.startswith("events.jsonl "), found
