"""`minilmd bench sft` and `bench packing` given a preference corpus (found by a new user: `bench sft --prepared dpop
--config cfg/dpo.toml --steps 1` ran DPO's whole reference pass for each mode, 244/2,431 pairs after 56 s, no figure
in 400 s). A DPO run's pairs are length-bucketed whatever data.mode says, so the modes these benches compare are the
same rows: refused at once, exit 2, with the reason, before any Trainer (and its reference pass) is built. Both
benches check their arguments by one function (trainer/bench/packing.py row_bench_config): a step count below one
is refused alike."""
from __future__ import annotations

import subprocess
import sys

import pytest

from trainer_corpus import child_env, write_config


@pytest.mark.slow  # a CLI process per bench (torch imported), on the DPO corpus fixture
@pytest.mark.parametrize("bench", ["sft", "packing"])
def test_bench_sft_and_packing_refuse_a_preference_corpus_before_any_reference_pass(tmp_path, dpo_corpus, bench):
    config = write_config(tmp_path, dpo_corpus, name="dpo", train={"seq_len": 128, "micro_batch_size": 2})
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "bench", bench, "--prepared", str(dpo_corpus[0]),
                           "--config", str(config), "--steps", "1"], capture_output=True, text=True, timeout=600,
                          env=child_env())
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"minilmd bench {bench}: {dpo_corpus[0]} is a preference corpus (prepared with "
                                  "--format dpo)"), done.stderr
    assert "not benchmarked" in done.stderr and "reference pass" in done.stderr
    assert "DPO reference" not in done.stdout, done.stdout  # no pass began: nothing of it was printed


@pytest.mark.parametrize("bench", ["sft", "packing"])
def test_bench_sft_and_packing_refuse_fewer_than_one_step_alike(tmp_path, dpo_corpus, bench, capsys):
    from minilmd.trainer.bench import packing, sft

    config = write_config(tmp_path, dpo_corpus, name="dpo", train={"seq_len": 128, "micro_batch_size": 2})
    main = {"sft": sft.main, "packing": packing.main}[bench]
    assert main(str(dpo_corpus[0]), str(config), steps=0) == 2
    assert capsys.readouterr().err == f"minilmd bench {bench}: --steps must be at least 1\n"
