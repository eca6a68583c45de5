"""A whole pipeline started at once: pretrain -> SFT -> LoRA as three `minilmd run` supervisors started together
(later stages first), each `init.from` naming the previous stage's config file, a fault injected into each stage's
trainer. The later stages wait in waiting_init, each starts from its predecessor's final synced checkpoint (the
fingerprint in every checkpoint it writes), and `status` shows the lineage. A stage whose predecessor fails ends
with exit 2 and says why instead of waiting forever."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from minilmd import checkpoint as ck
from minilmd import checkpoint_dirs
from minilmd.config import load_config
from minilmd.names import MANIFEST, TRAINER_STATE
from supervisor_helpers import cli, events, start_supervisor, state, wait_for, wait_or_kill, write_config

pytestmark = pytest.mark.slow  # three short real training runs in a row, two more supervisors: ~30 s


def stage(tmp_path, corpus, name: str, before: Path | None = None, **sections) -> Path:
    return write_config(tmp_path, corpus, name=name, **({"init": {"from": str(before)}} if before else {}),
                        train={"max_steps": 6, "checkpoint_every": 3}, **sections)


def final_checkpoint(config: Path) -> Path:
    remote = Path(load_config(config).run.remote)
    return remote / checkpoint_dirs.read_latest(remote)


def test_pretrain_sft_lora_started_together_each_from_its_predecessors_final_checkpoint(tmp_path, corpus):
    pretrain = stage(tmp_path, corpus, "pretrain")
    sft = stage(tmp_path, corpus, "sft", pretrain)
    lora = stage(tmp_path, corpus, "lora", sft, lora={"rank": 4, "alpha": 8.0})
    doomed = stage(tmp_path, corpus, "doomed", restart={"max_restarts": 0})
    after_doomed = stage(tmp_path, corpus, "after-doomed", doomed)
    # the doomed stage only fails (its own trainer's crash, no restart): the fake trainer's crash does, without a
    # real trainer's start
    procs = [start_supervisor(config, tmp_path / f"{config.stem}.out", fake=config == doomed, MINILMD_FAULT=fault)
             for config, fault in ((lora, "sigkill@4"), (sft, "exception@2"), (after_doomed, ""),
                                   (pretrain, "sigkill@4"), (doomed, "exception@1"))]
    sft_dir = load_config(sft).run_dir
    wait_for(lambda: state(sft_dir).get("phase") == "waiting_init", timeout=60)
    # the predecessor is read off the supervisor's loop (a stalled share must not hold it): what status says the
    # stage waits on comes with that read's first answer
    shown = [""]

    def says_what_it_waits_on() -> bool:
        shown[0] = cli("status", str(sft_dir), fake=False).stdout
        return "waiting for init.from: run pretrain" in shown[0]
    wait_for(says_what_it_waits_on, timeout=60)
    assert "waiting_init" in shown[0], shown[0]
    codes = [wait_or_kill(p, 240) for p in procs]
    outs = {c.stem: (tmp_path / f"{c.stem}.out").read_text()[-3000:] for c in (lora, sft, pretrain, after_doomed)}
    assert codes == [0, 0, 2, 0, 79], (codes, outs)

    for config, before in ((sft, pretrain), (lora, sft)):
        cfg, source = load_config(config), final_checkpoint(before)
        assert "init_ready" in [e.get("transition") for e in events(cfg.run_dir)]
        said = [e["message"] for e in events(cfg.run_dir) if e.get("event") == "update_share"]  # --check could not
        assert len(said) == 1 and said[0].startswith(("update share: this run trains", "WARNING: update share")), said
        restarts = state(cfg.run_dir)["restarts"]
        assert restarts and restarts[0]["cause"] in ("killed", "crash"), restarts  # its fault fired and was survived
        sha = hashlib.sha256((source / MANIFEST).read_bytes()).hexdigest()
        for ckpt in checkpoint_dirs.list_checkpoints(cfg.run.remote):
            init = json.loads((ckpt / TRAINER_STATE).read_text())["init"]
            assert (init["manifest_sha256"], init["step"]) == (sha, 6), (config.stem, ckpt, init)
    assert ck.saved_lora(ck.validate(final_checkpoint(lora)))["rank"] == 4

    shown = cli("status", str(load_config(lora).run_dir), fake=False).stdout
    lineage = next(line for line in shown.splitlines() if "lineage:" in line)
    assert lineage.count(" <- ") == 1 and "sft" in lineage and "pretrain" in lineage, shown
    failed = state(load_config(after_doomed).run_dir)
    assert failed["phase"] == "failed" and "run doomed failed with exit 79" in failed["last_error"], failed
