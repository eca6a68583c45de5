"""Both document-masked modes under the supervisor (`minilmd run` with the real trainer): SIGKILLed mid-run, restarted
from the last checkpoint, bit-identical at the end to the same run undisturbed.

(a) masked packed pretraining (`data.mode = "packed"`, `data.doc_mask = true`) on the text corpus, (b) padding-free
packed SFT (the same data section) on the chat corpus. The trainer kills itself before step 10 (MINILMD_FAULT, after
the saves of steps 4 and 8); the supervisor records the kill, restarts it, and it resumes from step 8 (from step 4
where step 8's background write had not finished at the kill). The final weights and optimizer state equal those of
conftest's undisturbed run (shared with test_docmask.py and test_docmask_sft.py's `minilmd train` resume tests),
every logged loss equals the undisturbed one at its step, and the remote's LATEST names the last checkpoint, which
records doc_mask.

Beside them, the shape of scripts/docmask_val_pair.py's table (masked vs unmasked val loss) on a tiny run pair.
"""
from __future__ import annotations

import json
import math
import signal
import sys
from pathlib import Path

import pytest

from minilmd import checkpoint as ck
from minilmd import checkpoint_dirs
from minilmd.config import load_config
from minilmd.names import FAULT_ENV
from resume_helpers import losses_by_step
from supervisor_helpers import run_supervisor, state
from trainer_corpus import ONE_LAYER_MODEL, resumed_step, write_config
from weights_helpers import assert_same_weights_and_optimizer

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.slow
@pytest.mark.parametrize("chat", [False, True], ids=["masked-pretraining", "padding-free-sft"])
def test_sigkilled_under_the_supervisor_ends_bit_identical(tmp_path, undisturbed, chat):
    straight = undisturbed("packed", doc_mask=True, chat=chat)
    config = straight.config_like(tmp_path, "sup", remote=True)
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path, timeout=300, fake=False, **{FAULT_ENV: "sigkill@10"}) == 0
    restarts = state(cfg.run_dir)["restarts"]
    assert [(r["cause"], r["exit"], r["action"]) for r in restarts] == [("killed", -signal.SIGKILL, "restart")]
    second = (cfg.run_dir / "logs" / "attempt-0002.log").read_text()
    # From step 8 as a rule; from step 4 where the kill came while step 8's background write was still under way
    # (a loaded machine): a checkpoint that is not whole is never resumed from, and the weights end the same.
    assert resumed_step(second) in (4, 8), second[-2000:]
    if chat:
        assert "packed rows" in second, second[-2000:]

    final = cfg.checkpoint_dir / straight.checkpoint.name
    assert_same_weights_and_optimizer(straight.checkpoint, final)
    assert losses_by_step(cfg.run_dir) == losses_by_step(straight.run_dir)
    assert checkpoint_dirs.read_latest(cfg.run.remote) == final.name
    saved = json.loads((final / ck.TRAINER_STATE).read_text())["config"]["data"]
    assert (saved["mode"], saved["doc_mask"]) == ("packed", True)


def test_the_val_pair_prints_both_runs_on_the_three_val_sets(tmp_path, corpus, capsys):
    sys.path.insert(0, str(SCRIPTS))  # a script, not a package
    try:
        import docmask_val_pair
    finally:
        sys.path.remove(str(SCRIPTS))
    config = write_config(tmp_path, corpus, model=dict(ONE_LAYER_MODEL),
                          train={"seq_len": 32, "micro_batch_size": 2, "grad_accum": 1, "max_steps": 2})
    assert docmask_val_pair.main(["--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("docmask val pair: ") and "2 steps" in lines[0], lines
    assert lines[1].split() == ["trained", "val:", "packed", "val:", "masked", "val:", "1", "doc/row"], lines
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in lines[2:]}
    assert list(rows) == ["unmasked", "masked"] and all(len(r) == 3 and all(map(math.isfinite, r))
                                                         for r in rows.values()), lines
    assert rows["unmasked"] != rows["masked"]  # the two runs trained differently
    assert rows["unmasked"][0] != rows["unmasked"][1]  # the mask changes what a model computes on the same windows
