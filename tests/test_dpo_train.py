"""DPO, the fourth stage (issue 42; trainer/loop/objective_dpo.py, dpo_reference.py, minilmd/plan/pairs.py): the loss
and its metrics checked by hand, ln 2 at step 0, pairs kept whole in length-bucketed micro-batches, the reference
computed once (saved at step 0, read back by every later start), a short CPU run on real pairs that learns (after a
short SFT, as the pipeline runs it), and a killed-and-resumed run that ends bit-identical to an undisturbed one."""
from __future__ import annotations

import json
import math
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from in_process import train_in_process
from minilmd.config import load_config
from minilmd.corpus.analysis.stats import width_class
from minilmd.corpus.format import open_prepared
from minilmd.daemon.views.fitwatch import fit_lines
from minilmd.names import DPO_REFERENCE, FAULT_ENV
from minilmd.plan.pairs import PairSampler
from minilmd.protocol import EXIT_CONFIG, EXIT_DONE
from minilmd.trainer.loop.objective_dpo import dpo_terms, sequence_logps
from minilmd.trainer.model.minimind import MiniMindForCausalLM, next_token_labels
from trainer_corpus import TINY_MODEL, child_env, read_metrics, resumed_step, run_paths, train, write_config

LN2 = math.log(2)


def test_the_loss_and_its_metrics_by_hand():
    policy = torch.tensor([-1.0, -3.0, -2.0, -2.0, -5.0, -4.0])  # three pairs: chosen, rejected, ...
    reference = torch.tensor([-2.0, -2.0, -2.0, -2.0, -4.0, -4.0])
    loss, m = dpo_terms(policy, reference, beta=0.5)
    # pair 0: rewards 0.5 and -0.5, margin 1; pair 1: 0 and 0; pair 2: -0.5 and 0, margin -0.5
    expected = -math.log(1 / (1 + math.exp(-1.0))) + LN2 - math.log(1 / (1 + math.exp(0.5)))
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    assert float(m["reward_accuracy"]) == pytest.approx(1 / 3)
    assert float(m["reward_margin"]) == pytest.approx((1 + 0 - 0.5) / 3)
    assert float(m["reward_chosen"]) == pytest.approx((0.5 + 0 - 0.5) / 3)
    assert float(m["reward_rejected"]) == pytest.approx((-0.5 + 0 + 0) / 3)
    same, m0 = dpo_terms(policy, policy.clone(), beta=0.1)  # the policy is the reference: step 0
    assert float(same) == pytest.approx(3 * LN2, abs=1e-6) and float(m0["reward_accuracy"]) == 0.0


def test_sequence_log_probabilities_are_the_masked_sums_of_the_models_own_logits():
    torch.manual_seed(0)
    model = MiniMindForCausalLM({**TINY_MODEL, "vocab_size": 50}).eval()
    ids = torch.randint(3, 50, (4, 9), dtype=torch.int32)
    targets = torch.zeros(4, 9, dtype=torch.uint8)
    targets[0, 5:] = 1
    targets[1, 3:7] = 1
    targets[2, 8] = 1
    targets[3, 1:] = 1
    labels = next_token_labels(ids, targets)
    with torch.no_grad():
        got = sequence_logps(model, ids, labels, None, chunk_rows=3)  # chunks of 3 and 1 rows
        logp = F.log_softmax(model(ids).logits.float(), dim=-1)
    for r in range(4):
        want = sum(float(logp[r, t - 1, int(ids[r, t])]) for t in range(1, 9) if targets[r, t])
        assert float(got[r]) == pytest.approx(want, abs=1e-5)


def test_pairs_stay_whole_in_length_bucketed_micro_batches(dpo_corpus):
    pc = open_prepared(dpo_corpus[0])
    t = pc.train
    sampler = PairSampler(t.tokens, t.doc_starts, 128, 7, 8, t.loss_mask)
    assert sampler.items_per_epoch == (t.n_docs // 2) // 8 * 8
    widths = []
    for step in range(20):
        batch = sampler.batch(step, 16, micro=1, micro_batch_size=8)
        assert batch.input_ids.shape[0] == 16 and batch.n_targets == 8  # 8 pairs, counted as the targets
        for i in range(8):
            c, r = batch.input_ids[2 * i], batch.input_ids[2 * i + 1]
            mc, mr = batch.targets[2 * i], batch.targets[2 * i + 1]
            start = int(np.argmax(mc))
            assert start == int(np.argmax(mr)) and (c[:start] == r[:start]).all()  # one prompt, two replies
        real = int((batch.input_ids != 0).sum(axis=1).max())
        assert batch.input_ids.shape[1] == width_class(real, 128)  # never padded to seq_len
        widths.append(batch.input_ids.shape[1])
    assert min(widths) < 128 and len(set(widths)) > 2


def _dpo_config(tmp_path, dpo_corpus, name, **train_values):
    return write_config(tmp_path, dpo_corpus, name=name, data={"val_windows": 64},
                        train={"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, "log_every": 1,
                               **train_values})


def _manifest_files(ckpt):
    return json.loads((ckpt / "manifest.json").read_text(encoding="utf-8"))["files"]


@pytest.mark.slow  # a 100-step SFT run, then a 60-step DPO run and a 40-step LoRA DPO run from it, in real processes
def test_a_short_dpo_run_after_sft_learns_the_preferences_and_never_recomputes_its_reference(
        tmp_path, chat_corpus, dpo_corpus):
    assert chat_corpus[1] == dpo_corpus[1]  # one tokenizer, one vocabulary
    sft = write_config(tmp_path, chat_corpus, name="sft", train={"seq_len": 128, "micro_batch_size": 8,
                                                                 "grad_accum": 1, "lr": 3e-3, "max_steps": 100,
                                                                 "checkpoint_every": 1000, "log_every": 50})
    assert train_in_process(sft).returncode == EXIT_DONE
    config = write_config(tmp_path, dpo_corpus, name="dpo", init={"from": str(run_paths(sft)[1])},
                          data={"val_windows": 64},
                          train={"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, "lr": 1e-4,
                                 "warmup_steps": 2, "max_steps": 60, "eval_every": 20, "checkpoint_every": 30,
                                 "log_every": 1})
    p = train_in_process(config)
    assert p.returncode == EXIT_DONE, p.stderr
    run_dir, ckpt_dir = run_paths(config)
    lines = read_metrics(run_dir, "train")
    assert lines[0]["loss"] == pytest.approx(LN2, abs=1e-5) and lines[0]["reward_margin"] == pytest.approx(0, abs=1e-5)
    evals = read_metrics(run_dir, "eval")
    assert [e["step"] for e in evals] == [20, 40, 60]
    assert evals[-1]["val_reward_accuracy"] >= 0.7, evals  # 0.92 measured
    assert evals[-1]["val_loss"] < LN2 - 0.1 and evals[-1]["val_reward_margin"] > 0
    made = read_metrics(run_dir, "dpo_reference")
    assert len(made) == 1 and made[0]["source"] == "computed" and made[0]["seconds"] > 0
    assert [s["step"] for s in read_metrics(run_dir, "checkpoint")][:1] == [0]  # saved at once: kept with the run
    steps = sorted(ckpt_dir.glob("step-*"))  # the newest keep_local of them
    first = (steps[0] / DPO_REFERENCE).read_bytes()
    for ckpt in steps:
        assert DPO_REFERENCE in _manifest_files(ckpt) and (ckpt / DPO_REFERENCE).read_bytes() == first
    from minilmd.checkpoint import validated_weights
    from minilmd.trainer.model.export import minimind_weight

    last_sft = sorted(run_paths(sft)[1].glob("step-*"))[-1]
    assert minimind_weight(validated_weights(steps[-1]).listed, chat=True) == "dpo"  # MiniMind's dpo_<hidden>.pth
    assert minimind_weight(validated_weights(last_sft).listed, chat=True) == "full_sft"
    shown = fit_lines(run_dir)
    assert any(line.startswith("  dpo: val reward accuracy") for line in shown), shown
    assert not any("ln 2" in line for line in shown), shown
    again = train_in_process(config, "train.max_steps=62")  # a later start: read back, not computed
    assert again.returncode == EXIT_DONE, again.stderr
    made = read_metrics(run_dir, "dpo_reference")
    assert [m["source"] for m in made] == ["computed", "checkpoint"] and "read from" in again.stdout

    # LoRA DPO: adapters on the frozen SFT model, whose log-probabilities are the reference (the adapters start at 0)
    lora = write_config(tmp_path, dpo_corpus, name="lora", init={"from": str(run_paths(sft)[1])},
                        lora={"rank": 8, "alpha": 16.0}, data={"val_windows": 64},
                        train={"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, "lr": 1e-3, "warmup_steps": 2,
                               "max_steps": 40, "eval_every": 20, "checkpoint_every": 20, "log_every": 1})
    assert train_in_process(lora).returncode == EXIT_DONE
    lora_dir, lora_ckpts = run_paths(lora)
    assert read_metrics(lora_dir, "train")[0]["loss"] == pytest.approx(LN2, abs=1e-5)
    assert read_metrics(lora_dir, "eval")[-1]["val_reward_accuracy"] >= 0.7  # 0.92 measured
    final = lora_ckpts / "step-00000040"
    assert DPO_REFERENCE in _manifest_files(final)
    assert all("lora_" in k for k in load_file(final / "model.safetensors"))  # the adapters alone


@pytest.mark.slow  # three DPO runs in real processes, one killed
def test_a_killed_and_resumed_dpo_run_ends_bit_identical_to_an_undisturbed_one(tmp_path, small_dpo_corpus):
    values = {"lr": 1e-3, "max_steps": 16, "checkpoint_every": 4, "eval_every": 8}
    straight = _dpo_config(tmp_path, small_dpo_corpus, "straight", **values)
    assert train_in_process(straight).returncode == EXIT_DONE
    killed = _dpo_config(tmp_path, small_dpo_corpus, "killed", **values)
    first = train(killed, **{FAULT_ENV: "sigkill@9"})
    assert first.returncode == -signal.SIGKILL
    second = train(killed, **{FAULT_ENV: "sigkill@9"})  # fired already: not again
    assert second.returncode == EXIT_DONE, second.stderr
    assert resumed_step(second.stdout) in (4, 8), second.stdout
    assert [m["source"] for m in read_metrics(run_paths(killed)[0], "dpo_reference")] == ["computed", "checkpoint"]
    final = "step-00000016"
    a_dir, b_dir = run_paths(straight)[1] / final, run_paths(killed)[1] / final
    for name in ("model.safetensors", "optimizer.safetensors"):
        a, b = load_file(a_dir / name), load_file(b_dir / name)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}:{k} differs after resume"
    assert (a_dir / DPO_REFERENCE).read_bytes() == (b_dir / DPO_REFERENCE).read_bytes()
    losses = lambda config: [(m["loss"], m["reward_accuracy"]) for m in read_metrics(run_paths(config)[0], "train")
                             if m["step"] == 16]
    assert losses(straight) == losses(killed)
    assert load_config(killed).dpo.beta == 0.1


@pytest.mark.slow  # a real DPO run
def test_status_warns_when_the_dpo_loss_stays_at_ln_2(tmp_path, small_dpo_corpus):
    """lr 0, a sanity run: the policy stays the reference, bit for bit, and every val loss is ln 2, as MiniMind's
    users report of its lr 4e-8."""
    config = _dpo_config(tmp_path, small_dpo_corpus, "still", lr=0.0, max_steps=6, eval_every=2, checkpoint_every=100)
    p = train_in_process(config)
    assert p.returncode == EXIT_DONE, p.stderr
    run_dir, ckpt_dir = run_paths(config)
    assert [e["val_loss"] for e in read_metrics(run_dir, "eval")] == [pytest.approx(LN2, abs=1e-6)] * 3
    assert {m["lr"] for m in read_metrics(run_dir, "train")} == {0.0}
    first, last = load_file(ckpt_dir / "step-00000000" / "model.safetensors"), load_file(
        ckpt_dir / "step-00000006" / "model.safetensors")
    assert first.keys() == last.keys() and all(torch.equal(first[k], last[k]) for k in first)  # nothing moved
    shown = fit_lines(run_dir)
    assert any("WARNING: DPO loss at ln 2 (0.6931) for the last 3 evals" in line for line in shown), shown
    from minilmd.daemon.views.plot import plot

    plot([run_dir], tmp_path / "still.png")  # a rate of 0 throughout: drawn as it is, nothing divides by it
    assert (tmp_path / "still.png").stat().st_size > 0


def test_a_dpo_models_minimind_export_is_named_as_minimind_names_it():
    from dataclasses import asdict

    from minilmd.config import ModelSection
    from minilmd.trainer.model.export import minimind_eval_command

    said = minimind_eval_command("/x/m.pth", asdict(ModelSection()), chat=True, weight="dpo")
    assert "out/dpo_768.pth" in said and "--weight dpo " in said
    assert "out/full_sft_768.pth" in minimind_eval_command("/x/m.pth", asdict(ModelSection()), chat=True)


def test_the_plan_counts_an_epoch_in_pairs_as_the_trainers_sampler_does(tmp_path, dpo_corpus):
    from minilmd.plan.budget import planned

    cfg = load_config(_dpo_config(tmp_path, dpo_corpus, "plan", max_steps=0, max_epochs=2.0))
    plan = planned(cfg)
    t = open_prepared(dpo_corpus[0]).train
    sampler = PairSampler(t.tokens, t.doc_starts, 128, cfg.train.seed, 8, t.loss_mask)
    assert plan is not None and plan.epoch is not None
    assert plan.epoch.rows == sampler.items_per_epoch == (t.n_docs // 2) // 8 * 8
    assert plan.epoch.unit == "pairs" and "pair" in plan.epoch.row_holds()
    assert plan.steps == 2 * sampler.items_per_epoch // 8  # global batch 8 pairs


def test_a_resume_from_a_checkpoint_without_the_reference_is_refused_not_computed_from_the_trained_policy(
        tmp_path, dpo_corpus):
    """The reference is the start model's: a checkpoint carrying none (not a DPO run's on this corpus) must not
    have it recomputed from its trained weights, which would make the policy its own reference from there on."""
    from minilmd.corpus_meta import CorpusError
    from minilmd.trainer.loop.dpo_reference import Preference
    from minilmd.trainer.loop.parts import Found

    cfg = load_config(_dpo_config(tmp_path, dpo_corpus, "foreign", max_steps=4))
    found = Found(tmp_path / "step-00000004", {}, {}, {"step": 4}, carried={})  # its manifest lists no reference
    preference = Preference(cfg, open_prepared(dpo_corpus[0]))
    with pytest.raises(CorpusError, match=f"carries no {DPO_REFERENCE}"):
        preference.start(host=None, found=found)  # refused before the trainer's model is touched
    assert preference.seconds is None


@pytest.mark.slow  # a DPO run, and two resumes of it, in real processes
def test_a_resume_at_another_seq_len_is_refused_not_trained_on_reference_sums_of_other_rows(tmp_path,
                                                                                              small_dpo_corpus):
    """Found by a reviewer: a DPO run resumed with train.seq_len changed (64 -> 32) read its reference sums back, of
    rows cut at 64, and trained the rows cut at 32 against them: exit 0, train loss 3.99, val_reward_chosen +6.07.
    The reference file records its seq_len; another one is refused (exit 2) before a step is taken."""
    config = _dpo_config(tmp_path, small_dpo_corpus, "cut", max_steps=4, checkpoint_every=4)
    assert train_in_process(config).returncode == EXIT_DONE
    run_dir, ckpt_dir = run_paths(config)
    shorter = train_in_process(config, "train.max_steps=6", "train.seq_len=64")
    assert shorter.returncode == EXIT_CONFIG, shorter.stdout + shorter.stderr
    header = json.loads((raw := (ckpt_dir / "step-00000004" / DPO_REFERENCE).read_bytes())[8:8 + int.from_bytes(
        raw[:8], "little")])
    assert json.loads(header["__metadata__"]["reference"])["seq_len"] == 128
    assert ("train.seq_len is 64; this DPO run's reference log-probs were computed at 128 (step-00000004): put it "
            "back, or start the DPO stage as a new run") in shorter.stderr
    assert [s["step"] for s in read_metrics(run_dir, "checkpoint")] == [0, 4]  # nothing trained, nothing saved
    check = subprocess.run([sys.executable, "-m", "minilmd.cli", "run", "--check", str(config), "--set",
                            "train.max_steps=6", "--set", "train.seq_len=64"], capture_output=True, text=True,
                           timeout=300, env=child_env())  # refused before a launch, in the trainer's words
    assert check.returncode == EXIT_CONFIG and ("train.seq_len is 64; this DPO run's reference log-probs were "
                                                "computed at 128 (step-00000004)") in check.stderr, check.stderr
    same = train_in_process(config, "train.max_steps=6")  # at its own seq_len it goes on, the reference read back
    assert same.returncode == EXIT_DONE, same.stderr
    assert [m["source"] for m in read_metrics(run_dir, "dpo_reference")] == ["computed", "checkpoint"]


def test_a_reference_file_written_before_seq_len_was_recorded_is_read_at_the_runs_seq_len(dpo_corpus, capsys):
    """A reference file of an older minilmd records only the corpus's fingerprint: taken as computed at the run's
    current seq_len (nothing says otherwise); one that records a seq_len is held to it, and one of other matmuls
    is read with a note (a run moved from a bf16 GPU to a CPU: its rounding, not other rows)."""
    from safetensors.numpy import save

    from minilmd.config import ConfigError
    from minilmd.trainer.loop.dpo_reference import reference_bytes, reference_sums

    corpus = open_prepared(dpo_corpus[0])
    sums = {"train": np.arange(corpus.train.n_docs, dtype=np.float32), "val": np.ones(corpus.val.n_docs, np.float32)}
    now = {"data_fingerprint": corpus.data_fingerprint, "seq_len": 128, "matmul": "fp32"}
    old = save(sums, metadata={"data_fingerprint": corpus.data_fingerprint})
    ckpt = dpo_corpus[0] / "step-00000012"
    read, record, _ = reference_sums(old, corpus, ckpt, now, printing=True)
    assert np.array_equal(read["train"], sums["train"]) and capsys.readouterr().out == ""
    assert record == {"data_fingerprint": corpus.data_fingerprint, "seq_len": 128}  # held to it from now on
    with pytest.raises(ConfigError, match="train.seq_len is 32; this DPO run's reference log-probs were computed "
                                          r"at 128 \(step-00000012\)"):
        reference_sums(reference_bytes(sums, record), corpus, ckpt, {**now, "seq_len": 32}, printing=True)
    gpu_record = {**now, "matmul": "bf16"}
    on_gpu = reference_bytes(sums, gpu_record)
    assert on_gpu == reference_bytes(sums, dict(reversed(gpu_record.items())))  # the same bytes, whatever the order
    read, record, _ = reference_sums(on_gpu, corpus, ckpt, now, printing=True)
    assert np.array_equal(read["val"], sums["val"]) and record["matmul"] == "bf16"  # written on as it was read
    assert "computed with bf16 matmuls, this attempt runs fp32" in capsys.readouterr().out
