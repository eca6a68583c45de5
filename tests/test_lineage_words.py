"""`minilmd status`'s lineage (daemon/phases/initwait.py lineage) says each stage's source as what it is. A stage
started from a .pth (MiniMind's weights, or `minilmd export --format minimind --merge`'s of a LoRA run, the way a
LoRA run's model goes on to another stage) read `merged.pth (step -, sha256 ...)`: a .pth records no step, nor
what it came from. Fake checkpoints: a manifest.json and the trainer_state.json "init" the lineage reads."""
from __future__ import annotations

import json

from minilmd.daemon.phases.initwait import lineage


def _checkpoint(root, step: int, init: dict):
    ckpt = root / f"step-{step:08d}"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text(json.dumps({"step": step, "files": {}}), encoding="utf-8")
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "init": init}), encoding="utf-8")
    return ckpt


def test_a_stage_from_a_merged_pth_reads_as_a_pth_not_a_step_of_dash(tmp_path):
    merged = str(tmp_path / "merged.pth")
    sft = _checkpoint(tmp_path / "sft", 6, {"from": merged, "kind": "minimind", "path": merged, "sha256": "ab" * 32})
    _checkpoint(tmp_path / "dpo", 4, {"from": str(sft.parent), "kind": "checkpoint", "path": str(sft), "step": 6,
                                      "manifest_sha256": "cd" * 32, "pointer": "LATEST"})
    assert lineage(tmp_path / "dpo") == [
        f"{sft} (step 6, its LATEST, manifest sha256 cdcdcdcdcdcd)",
        f"{merged} (a .pth: weights alone, no step nor source recorded; sha256 abababababab)"]
