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
from minilmd.daemon.base.runstate import RunState, new_state, read_heartbeat
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


OLDER_TRAINERS = (
    # (the body, the commit whose trainer first wrote it: git log -p minilmd/metrics.py trainer/loop) -> what the new
    # reader gives: step, phase, note, total, the DPO reference pass
    ("12", "fe6d84c7", 12, "", "", None, None),  # the step alone
    ("12 compiling", "d2fda1bb", 12, names.HEARTBEAT_COMPILING, "", None, None),
    ("20 exiting", "8604857c", 20, names.HEARTBEAT_EXITING, "", None, None),
    ("0 reference 5/10", "3c35f7d3", 0, names.HEARTBEAT_REFERENCE, "5/10", None, [5, 10]),
    ("0 reference 5/10/2/3", "5749e0f9", 0, names.HEARTBEAT_REFERENCE, "5/10/2/3", None, [5, 10, 2, 3]),
    ("12/950", "f958e0c3", 12, "", "", 950, None),  # the total beside the step
    ("12/950 compiling", "f958e0c3", 12, names.HEARTBEAT_COMPILING, "", 950, None),
    ("0/950 reference 5/10/2/3", "f958e0c3", 0, names.HEARTBEAT_REFERENCE, "5/10/2/3", 950, [5, 10, 2, 3]),
    ("20/20 exiting", "f958e0c3", 20, names.HEARTBEAT_EXITING, "", 20, None),  # until dd4505cb: "20 exiting" again
)


def test_every_body_an_older_trainer_wrote_is_read_by_the_new_reader(tmp_path):
    """The other direction: a new supervisor (or `status`) and a trainer of an older version still running after an
    upgrade (an orphan of the old supervisor at the first start after it; a trainer command of one's own). Every form
    a trainer has written since the first heartbeat gives its step and phase to the one reader (read_heartbeat:
    the hang watch, the finish in a slow teardown, an orphan's loss, the progress), its note and total where it says
    them, and the supervisor's progress shows its step (and its total, once said)."""
    for body, since, step, phase, note, total, ref in OLDER_TRAINERS:
        (tmp_path / names.HEARTBEAT).write_text(body + "\n")
        beat = read_heartbeat(tmp_path)
        assert beat is not None, (body, since)
        assert (beat.step, beat.phase, beat.note, beat.total, beat.reference_pass()) == \
            (step, phase, note, total, ref), (body, since, beat)
        state = RunState(tmp_path / names.STATE, new_state("up", tmp_path, str(tmp_path / "up.toml")))
        state.apply_progress([], beat)
        assert (state.progress.step, state.progress.total_steps) == (step, total), (body, since)
    assert old_supervisors_step("20 exiting") == 20  # today's exiting beat: the oldest reader reads it too
