"""The heartbeat across an upgrade of minilmd in the middle of a run (docs/operations.md, upgrades): the trainer and
the supervisor that read each other's heartbeat may be of two versions.

- An older supervisor (started before `pip install -U`, its code in memory) restarts its trainer, which is the new
  one: its heartbeat body is "STEP/TOTAL[ PHASE ...]" where the old reader (before the total, commit de127b43) took
  a step only from a plain number. The old reader judges a hang by the file's mtime and its phase word, which the
  total does not move; the one judgement it makes on the step is whether a trainer killed after its "exiting" beat
  had finished (trainerwatch.finished_before_end). Run for real (an old supervisor of that commit, the new trainer
  lingering in its teardown, restart.exit_timeout 3s): "20/20 exiting" was no step to it, each attempt a restart
  at the final step that saved nothing, and the run failed, exit 79 (no_progress_limit), where the old trainer's
  "20 exiting" finished it, exit 0. The exiting beat's step is a plain number again.
- A new supervisor reads an older trainer's bodies ("STEP[ PHASE ...]", no total): an orphan of the old version at
  the first start after the upgrade, a trainer command of one's own (MINILMD_TRAINER_CMD).
"""
from __future__ import annotations

from pathlib import Path

from minilmd import names
from minilmd.daemon.base.runstate import read_heartbeat
from minilmd.metrics import MetricsLog


def old_supervisors_step(body: str) -> int | None:
    """The step a supervisor from before the total reads in a heartbeat body (its read_heartbeat at de127b43,
    verbatim but for the file's reading)."""
    words = body.split()
    try:
        return int(words[0]) if words else None
    except ValueError:
        return None


def written(run_dir: Path, step: int, total: int | None, phase: str = "", note: str = "") -> str:
    log = MetricsLog(run_dir)
    log.total_steps = total
    assert log.heartbeat(step, phase=phase, force=True, note=note)
    return (run_dir / names.HEARTBEAT).read_text()


def test_the_exiting_beat_tells_an_older_supervisor_its_step(tmp_path):
    """What finished_before_end of an older supervisor reads: the step of the "exiting" beat, with its phase."""
    body = written(tmp_path, 20, 20, names.HEARTBEAT_EXITING)
    assert old_supervisors_step(body) == 20, body  # "20/20 exiting" before: no step, a restart, the run failed
    assert body.split()[1] == names.HEARTBEAT_EXITING, body  # the phase word the old reader takes
    beat = read_heartbeat(tmp_path)  # and the new reader reads it alike
    assert beat is not None and (beat.step, beat.phase, beat.total) == (20, names.HEARTBEAT_EXITING, None), beat


def test_the_other_beats_keep_the_phase_an_older_supervisor_judges_a_hang_by(tmp_path):
    """An older supervisor's hang watch reads the mtime and the second word, the phase (compile_timeout while
    "compiling", the plain hang_timeout otherwise): the total beside the step moves neither."""
    for phase, note in (("", ""), (names.HEARTBEAT_COMPILING, ""), (names.HEARTBEAT_REFERENCE, "5/10/0/1")):
        body = written(tmp_path, 7, 950, phase, note)
        words = body.split()
        assert words[0] == "7/950" and (words[1] if len(words) > 1 else "") == phase, body
        assert " ".join(words[2:]) == note, body


def test_an_older_trainers_bodies_are_read_by_the_new_reader(tmp_path):
    """"STEP[ PHASE ...]" as a trainer from before the total wrote it: its step and phase, no total."""
    for body, step, phase, note in (("12", 12, "", ""), ("12 compiling", 12, names.HEARTBEAT_COMPILING, ""),
                                    ("0 reference 5/10", 0, names.HEARTBEAT_REFERENCE, "5/10"),
                                    ("20 exiting", 20, names.HEARTBEAT_EXITING, "")):
        (tmp_path / names.HEARTBEAT).write_text(body + "\n")
        beat = read_heartbeat(tmp_path)
        assert beat is not None and (beat.step, beat.phase, beat.note, beat.total) == (step, phase, note, None), body
    assert beat.step == old_supervisors_step("20 exiting")
