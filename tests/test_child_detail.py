"""The detail of an ended trainer as the supervisor classifies it: a final refusal quoted from the attempt log
starts at the trainer's own line (never inside the supervisor's `# attempt ...` header, never mid-token) and ends at a
word; a stop (exit 75) is said stopped, never "saved" (a stop in the DPO reference pass saves nothing)."""
from __future__ import annotations

import sys

import pytest

from minilmd.daemon.child.death import _last_lines, classify
from minilmd.daemon.child.process import launch

SHA_A, SHA_B = "a" * 64, "b" * 64
REFUSAL = (f"minilmd train: refusing to resume: /dev/shm/minilmd-0/demo/checkpoints/step-00000016: tokenizer "
           f"fingerprint differs: checkpoint {SHA_A!r}, run {SHA_B!r} (a different tokenizer than this run uses)")


def test_a_fingerprint_refusal_is_quoted_from_its_first_word(tmp_path):
    # the command line the supervisor writes into the log header is long (overrides with quoted paths)
    corpus = "/dev/shm/minilmd-0/demo/" + "corpus-" * 30
    code = f"import sys; print({REFUSAL!r}, file=sys.stderr); sys.exit(65)"
    child = launch([sys.executable, "-c", code, "--set", f'data.prepared="{corpus}"'], tmp_path, 1, devices="")
    rc = child.popen.wait(30)
    death = classify(child, rc, tmp_path, stop_requested=False)
    assert death.cause == "data_error"
    assert death.detail == REFUSAL


def test_a_line_over_the_limit_keeps_its_start_and_ends_at_a_word(tmp_path):
    log = tmp_path / "attempt-0001.log"
    words = " ".join(f"word{i:03d}" for i in range(200))
    log.write_text(f"# attempt 1: python -m minilmd.cli train x.toml\n# CUDA_VISIBLE_DEVICES=''\nearlier line\n"
                   f"minilmd train: {words}\n")
    detail = _last_lines(log, limit=100)
    assert detail.startswith("minilmd train: word000 ")
    assert detail.endswith(" …") and len(detail) <= 100
    assert detail[:-2].split(" ")[-1].startswith("word") and len(detail[:-2].split(" ")[-1]) == 7


def test_whole_lines_from_the_end_while_they_fit(tmp_path):
    log = tmp_path / "attempt-0001.log"
    log.write_text("# attempt 1: cmd\n# CUDA_VISIBLE_DEVICES=''\n" + "x" * 80 + "\nTraceback (most recent call last):\n"
                   "ValueError: bad\n")
    assert _last_lines(log, limit=60) == "Traceback (most recent call last): | ValueError: bad"
    assert _last_lines(log) == "x" * 80 + " | Traceback (most recent call last): | ValueError: bad"


@pytest.mark.parametrize("requested, said", [(True, "stopped on request"),
                                             (False, "stopped on a SIGTERM the supervisor did not send")])
def test_a_stop_during_the_dpo_reference_pass_is_not_said_saved(tmp_path, requested, said):
    """The trainer exits 75 on a stop in the DPO reference pass with nothing saved (trainer/loop/exits.py
    StoppedInPass): the supervisor said "saved and stopped on request". Now it says stopped; what was saved is the
    trainer's own line (here: nothing) and the checkpoints'."""
    line = "minilmd: SIGTERM received during the DPO reference pass (12/300 pairs); nothing saved"
    child = launch([sys.executable, "-c", f"print({line!r}); raise SystemExit(75)"], tmp_path, 1, devices="")
    rc = child.popen.wait(30)
    death = classify(child, rc, tmp_path, stop_requested=requested)
    assert (death.cause, death.exit) == ("stopped", 75)
    assert death.detail == said


@pytest.mark.parametrize("removed", [False, True])
def test_exit_73_says_removed_when_run_dir_is_gone_and_full_otherwise(tmp_path, removed):
    """The trainer exits 73 for a full run.dir and for one removed under it (fsio.dir_removed): the supervisor's
    child_exit line said "run.dir full ... had no room" for both (fault10 F4)."""
    import shutil

    from minilmd import protocol

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    child = launch([sys.executable, "-c", f"import sys; sys.exit({protocol.EXIT_RUN_DIR_FULL})"], run_dir, 1,
                   devices="")
    rc = child.popen.wait(30)
    if removed:
        shutil.rmtree(run_dir)
    death = classify(child, rc, run_dir, stop_requested=False)
    assert death.cause == "run_dir_full" and death.exit == protocol.EXIT_RUN_DIR_FULL
    assert ("removed while the run ran" in death.detail) is removed
    assert ("run.dir full" in death.detail) is not removed
