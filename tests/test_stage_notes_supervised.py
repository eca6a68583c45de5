"""What `run --check` notes of init.from's checkpoint (minilmd/stage_notes.py init_from_notes: another tokenizer or chat
template than the corpus's), said by the supervisor once it has staged that checkpoint: into supervisor.log and
events.jsonl (event "note") and state.json's notes, which `minilmd status` shows. Real supervisors, the fake
trainer: SFT stages queued behind a pretraining run that has no checkpoint yet (nothing for `--check` to compare),
one of them on a corpus whose tokenizer.json was saved again (the same tokenizer, other bytes: a note, never a
refusal), and one launched without `--check` after the pretraining run finished. On main none of them said a word."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import RunState, new_state
from minilmd.daemon.base.worker import ReadWatch
from minilmd.daemon.jobs import stagingworker
from minilmd.daemon.views.status import summary_lines
from minilmd.names import CORPUS_META, SUPERVISOR_LOG, TOKENIZER_FILE
from supervisor_helpers import cli, events, start_supervisor, state, wait_for, wait_or_kill, write_config

TRAIN = {"max_steps": 6, "checkpoint_every": 3}


def _resaved_tokenizer(corpus: tuple[Path, int], dest: Path) -> tuple[Path, int]:
    """A copy of `corpus` whose tokenizer.json is the same tokenizer saved again (indented: other bytes, another
    sha256), its meta.json updated to match, as `minilmd prepare` with such a tokenizer directory writes it."""
    root = Path(shutil.copytree(corpus[0], dest))
    raw = json.dumps(json.loads((root / TOKENIZER_FILE).read_bytes()), indent=1, ensure_ascii=False).encode()
    (root / TOKENIZER_FILE).write_bytes(raw)
    meta = json.loads((root / CORPUS_META).read_text(encoding="utf-8"))
    sha = hashlib.sha256(raw).hexdigest()
    assert sha != meta["tokenizer_sha256"]
    meta["tokenizer_sha256"] = sha
    meta["files"][TOKENIZER_FILE] = {"size": len(raw), "sha256": sha}
    (root / CORPUS_META).write_text(json.dumps(meta), encoding="utf-8")
    return root, corpus[1]


def _notes_said(run_dir: Path) -> tuple[list[str], str, str]:
    """(the "note" events, supervisor.log's [note] lines, `minilmd status`'s note lines) of a run."""
    said = [e["message"] for e in events(run_dir) if e.get("event") == "note"]
    log = "\n".join(line for line in (run_dir / SUPERVISOR_LOG).read_text().splitlines() if "[note]" in line)
    shown = "\n".join(line for line in cli("status", str(run_dir)).stdout.splitlines() if "note:" in line)
    return said, log, shown


@pytest.mark.slow  # four real supervisors, short fake-trainer runs: ~45 s on 2 busy cores
def test_a_stage_queued_behind_its_predecessor_says_the_tokenizer_differs_once_its_checkpoint_is_staged(
        tmp_path, corpus):
    other = _resaved_tokenizer(corpus, tmp_path / "share" / "sft-corpus")
    pretrain = write_config(tmp_path, corpus, name="pretrain", train=TRAIN)
    sft_other = write_config(tmp_path, other, name="sft-other", init={"from": str(pretrain)}, train=TRAIN)
    sft_same = write_config(tmp_path, corpus, name="sft-same", init={"from": str(pretrain)}, train=TRAIN)
    other_dir, same_dir = load_config(sft_other).run_dir, load_config(sft_same).run_dir
    waiting = [start_supervisor(c, tmp_path / f"{c.stem}.out") for c in (sft_other, sft_same)]
    try:
        for run_dir in (other_dir, same_dir):  # queued while the predecessor has no checkpoint at all
            wait_for(lambda d=run_dir: state(d).get("phase") == "waiting_init", 60, "the stage to wait")
        assert wait_or_kill(start_supervisor(pretrain, tmp_path / "pretrain.out"), 120) == 0
        codes = [wait_or_kill(p, 120) for p in waiting]
    finally:
        for p in waiting:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0], [(tmp_path / f"{c.stem}.out").read_text()[-3000:] for c in (sft_other, sft_same)]

    said, log, shown = _notes_said(other_dir)
    assert len(said) == 1, said
    assert said[0].startswith(f"init.from = {str(pretrain)!r}: ") and (
        f"was trained with another tokenizer than the corpus {other[0]} was prepared with (tokenizer.json sha256 "
        f"{json.loads((corpus[0] / CORPUS_META).read_text())['tokenizer_sha256'][:12]}") in said[0], said
    assert f"[note] {said[0]}" in log, log
    assert shown == f"  note: {said[0]}", shown
    assert state(other_dir)["notes"] == said
    assert _notes_said(same_dir) == ([], "", "")  # the same tokenizer: nothing to say
    assert state(same_dir)["notes"] == []

    late = write_config(tmp_path, other, name="sft-late", init={"from": str(pretrain)}, train=TRAIN)
    late_dir = load_config(late).run_dir  # launched without --check once its predecessor has finished
    assert wait_or_kill(start_supervisor(late, tmp_path / "late.out"), 120) == 0, (tmp_path / "late.out").read_text()
    said, log, shown = _notes_said(late_dir)
    assert len(said) == 1 and "was trained with another tokenizer than the corpus" in said[0], said
    assert f"[note] {said[0]}" in log and shown == f"  note: {said[0]}", (log, shown)

    # a LoRA run stages its base at every start: a restart with a checkpoint of its own says nothing anew, so what
    # its first start noted (adopted from state.json) is never wiped by an empty list
    lora = load_config(write_config(tmp_path, other, name="lora", init={"from": str(pretrain)},
                                    lora={"rank": 4, "alpha": 8.0}))
    sets, notes = stagingworker._stage_inputs(lora, lambda msg: None, ReadWatch(), None)
    assert "init.staged" in sets and notes is not None and len(notes) == 1 and "another tokenizer" in notes[0], notes
    own = lora.checkpoint_dir / "step-00000003"
    own.mkdir(parents=True)
    (own / names.MANIFEST).write_text("{}")
    (own / names.TRAINER_STATE).write_text("{}")
    sets, notes = stagingworker._stage_inputs(lora, lambda msg: None, ReadWatch(), None)
    assert "init.staged" in sets and notes is None


def test_the_notes_survive_a_supervisor_restart_and_status_shows_them(tmp_path):
    """A restarted supervisor resumes from the run's own checkpoint and stages init.from no more: what that
    checkpoint noted stays in state.json (adopted), and `status` goes on showing it."""
    first = RunState(tmp_path / names.STATE, new_state("sft", tmp_path, "sft.toml"))
    first.notes = ["init.from = '/nfs/pretrain.toml': ... was trained with another tokenizer than the corpus ..."]
    first.save()
    second = RunState(tmp_path / names.STATE, new_state("sft", tmp_path, "sft.toml"))
    second.adopt(json.loads((tmp_path / names.STATE).read_text()), None)
    assert second.notes == first.notes
    lines = summary_lines(second, alive=True)
    assert f"  note: {first.notes[0]}" in lines, lines
