"""The trainer appends metrics.jsonl as every run log is appended (minilmd/jsonlines.py: no link followed, no FIFO
written or waited on, a line whole or not at all). Before (house9 item 2), minilmd/metrics.py opened it with open():
a link at its name was appended through, a FIFO crashed the trainer at its start (io.UnsupportedOperation, then
restart after restart), and a line cut by a full disk stayed half written, glued to the next one."""
from __future__ import annotations

import json
import os
import threading
from types import SimpleNamespace

import pytest

from filling import fill
from minilmd import names, protocol
from minilmd.jsonlines import NotALog
from minilmd.metrics import MetricsLog, RunDirFileRefused


def steps_in(path) -> list:
    """The step of every line of the file, each of which must be a whole JSON object."""
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_link_in_place_of_metrics_jsonl_is_not_written_through(tmp_path):
    run_dir, target = tmp_path / "run", tmp_path / "her-notes"
    run_dir.mkdir()
    target.write_text("hers\n")
    (run_dir / names.METRICS).symlink_to(target)
    with pytest.raises(RunDirFileRefused, match="metrics.jsonl is a symbolic link: not written through"):
        MetricsLog(run_dir)
    (run_dir / names.METRICS).unlink()
    log = MetricsLog(run_dir)  # a link planted after the start: refused at the write, not followed
    (run_dir / names.METRICS).symlink_to(target)
    with pytest.raises(NotALog):
        log.write("train", step=1)
    assert target.read_text() == "hers\n"


def test_a_fifo_at_metrics_jsonl_is_a_final_refusal_at_the_start_not_a_hang_or_a_crash(tmp_path):
    from minilmd.trainer.loop.exits import status_of

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / names.METRICS)
    said: list[BaseException] = []

    def start() -> None:
        try:
            MetricsLog(run_dir)
        except BaseException as e:  # noqa: BLE001 - what the start raised, looked at below
            said.append(e)

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    starting.join(60)
    assert not starting.is_alive(), "the trainer's start waited on the FIFO"
    assert len(said) == 1 and isinstance(said[0], RunDirFileRefused) and "a FIFO" in str(said[0]), said
    assert status_of(SimpleNamespace(run_dir=run_dir), said[0], None, 0) == protocol.EXIT_CONFIG  # final
    fault = protocol.read_fault(run_dir)
    assert fault is not None and protocol.fault_note(fault) is protocol.FaultNote.REFUSED and "remove it" in \
        fault["message"]


def test_a_line_cut_by_a_full_disk_leaves_nothing_and_the_next_line_is_whole(small_tmpfs):
    disk = small_tmpfs("256k")
    log = MetricsLog(disk / "run")
    log.write("train", step=1)
    filler = fill(disk)  # the disk full, but for the rest of metrics.jsonl's last page: a long line is cut there
    log.write("train", step=2, pad="x" * 8192)
    assert log.writes.dropped == 1 and "No space left" in log.writes.full
    assert (disk / "run" / names.METRICS).read_bytes().endswith(b"\n")
    filler.unlink()
    log.write("train", step=3)
    assert steps_in(disk / "run" / names.METRICS) == [1, 3]


def test_a_line_torn_by_a_killed_trainer_is_ended_at_the_next_start(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / names.METRICS).write_text('{"kind": "train", "step": 1}\n{"kind": "train", "st')
    MetricsLog(run_dir).write("train", step=2)
    lines = (run_dir / names.METRICS).read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["step"] == 2
