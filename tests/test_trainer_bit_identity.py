"""The Trainer's structure may change, its numbers may not: tiny pretraining (packed, doc_mask, stopped and resumed),
bucketed SFT and LoRA runs end with the weights, optimizer state and validation loss that main's Trainer gave before
it was split into parts (tests/trainer_bit_identity.py made the fixture there, tests/trainer_bit_identity.json).

The digests are of CPU float arithmetic: they hold for the torch build and the CPU kernels the fixture records.
Elsewhere (another torch, another vector unit) the test says so and skips rather than compare numbers that were
never meant to match; then `python tests/trainer_bit_identity.py --write` on main's code, there, makes a fixture
for that machine.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_bit_identity import FIXTURE, where


@pytest.mark.slow
def test_pretrain_sft_and_lora_end_bit_identical_to_main(tmp_path):
    want = json.loads(FIXTURE.read_text(encoding="utf-8"))
    if want["where"] != where():
        pytest.skip(f"the fixture was recorded on {want['where']}, this is {where()}")
    out = tmp_path / "digests.json"
    script = Path(__file__).with_name("trainer_bit_identity.py")
    done = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(out.read_text(encoding="utf-8"))
    assert got["runs"].keys() == want["runs"].keys()
    for name, run in want["runs"].items():
        assert got["runs"][name] == run, name
    # The resumed runs end where the straight ones do: the fixture itself is of bit-exact resumes.
    for name in ("pretrain", "sft-bucketed", "lora"):
        assert want["runs"][f"{name}-resumed"] == want["runs"][name]
