"""Early stop against overfitting: a tiny corpus trained for many epochs under `minilmd run` stops itself (exit 0,
final sync) once the val loss stops improving; BEST names the checkpoint of the lowest val loss, locally and on the
remote, pruning and retention keep it, `export` takes ROOT/BEST; `status` shows train and val loss per epoch with the
per-batch spread and warned before the stop. The EarlyStop counter and the warnings are also checked alone."""
from __future__ import annotations

import json

import pytest

from minilmd import checkpoint as ck
from minilmd import checkpoint_dirs, names
from minilmd.config import load_config
from minilmd.daemon.views.fitwatch import fit_lines, warnings
from minilmd.names import BEST
from minilmd.plan.early_stop import EarlyStop
from supervisor_helpers import cli, run_supervisor, write_config
from trainer_corpus import TINY_MODEL, read_metrics, real_text_prepared


def test_early_stop_counts_validations_without_a_new_best():
    e = EarlyStop(patience=2, min_delta=0.01)
    assert [e.update(s, {"val_loss": v}) for s, v in ((1, 3.0), (2, 2.5), (3, 2.495), (4, 2.6))] == [
        True, True, False, False]
    assert e.should_stop and (e.best_step, e.best_value) == (2, 2.5) and e.best_fields() == {"best_val_loss": 2.5,
                                                                                         "best_step": 2}
    again = EarlyStop(patience=2, min_delta=0.01)
    again.load_state_dict({"step": 4, "early_stop": e.state_dict()["early_stop"]})  # a trainer_state.json
    assert again.should_stop and again.state_dict() == e.state_dict()
    fresh = EarlyStop(patience=2, min_delta=0.01)
    fresh.load_state_dict({"step": 4})  # a checkpoint from before early stop: nothing to count on
    assert fresh.state_dict() == {"early_stop": {"metric": "val_loss", "best_step": None, "best_value": None,
                                                 "since_best": 0}}
    assert not EarlyStop(patience=0, min_delta=0).should_stop
    older = EarlyStop(patience=2, min_delta=0.01)  # a checkpoint from before early_stop.metric: the val loss's
    older.load_state_dict({"early_stop": {"best_step": 2, "best_val_loss": 2.5, "since_best": 1}})
    assert (older.best_step, older.best_value, older.since_best) == (2, 2.5, 1)


def test_the_reward_accuracy_is_better_higher_and_a_changed_metric_counts_anew():
    """A DPO run's early_stop.metric = "val_reward_accuracy": a new best is above the best by more than min_delta
    (the val loss's rule, below it, would take 0.5 -> 0.4 for progress and stop a run that learns)."""
    e = EarlyStop(patience=2, min_delta=0.01, metric="val_reward_accuracy")
    seen = [(1, 0.5, 0.69), (2, 0.75, 0.60), (3, 0.755, 0.55), (4, 0.70, 0.50)]
    assert [e.update(s, {"val_reward_accuracy": a, "val_loss": v}) for s, a, v in seen] == [True, True, False, False]
    assert e.should_stop and (e.best_step, e.best_value) == (2, 0.75)
    assert e.best_fields() == {"best_val_reward_accuracy": 0.75, "best_step": 2}
    assert e.best_said() == "val_reward_accuracy 0.7500 at step 2"
    by_loss = EarlyStop(patience=2, min_delta=0.01)  # the same run resumed with the metric changed back
    by_loss.load_state_dict({"early_stop": e.state_dict()["early_stop"]})
    assert (by_loss.best_step, by_loss.best_value, by_loss.since_best) == (None, None, 0)


def test_a_reward_metric_is_refused_for_a_corpus_that_is_not_dpo(tmp_path):
    """Where the config is checked against its corpus (run --check, the supervisor, `minilmd train`: probes) and
    where the trainer opens the corpus (EarlyStop.from_config): one message, naming the fix."""
    from minilmd.config import ConfigError
    from minilmd.probes import load_checked

    prepared = tmp_path / "text"  # a text corpus as far as the check reads it: its meta.json
    prepared.mkdir()
    (prepared / "meta.json").write_text(json.dumps({"format": "minilmd-prepared", "version": 1, "vocab_size": 300,
                                                    "splits": {"val": {"documents": 8, "tokens": 900}}}))
    config = write_config(tmp_path, (prepared, 300), name="text", model=dict(TINY_MODEL),
                          early_stop={"patience": 2, "metric": "val_reward_accuracy"})
    with pytest.raises(ConfigError) as e:
        load_checked(config)
    assert ("early_stop.metric = 'val_reward_accuracy' needs a preference corpus (`minilmd prepare --format dpo`), "
            f"but data.prepared = '{prepared}' is a text corpus") in str(e.value)
    assert 'use early_stop.metric = "val_loss"' in str(e.value)
    cfg = load_config(config)  # the values alone are fine: the corpus decides
    with pytest.raises(ConfigError, match="needs a preference corpus"):
        EarlyStop.from_config(cfg, "chat")
    assert EarlyStop.from_config(cfg, "dpo").metric == "val_reward_accuracy"
    with pytest.raises(ConfigError, match=r"early_stop.metric = 'accuracy': must be \"val_loss\" or "
                                          r"\"val_reward_accuracy\""):
        load_config(config, ["early_stop.metric=accuracy"])


def test_a_meta_json_that_cannot_be_read_is_not_taken_for_a_text_corpus_by_the_metric_check(tmp_path):
    """A torn meta.json (its format unknown) says nothing about the metric: the trainer, which opens the corpus,
    refuses what does not fit; the check must not call a preference corpus "a text corpus"."""
    from minilmd.probes import _check_prepared_dir

    prepared = tmp_path / "torn"
    prepared.mkdir()
    (prepared / "meta.json").write_text('{"format": "minilmd-prepared", "data_format": "dpo", "vocab_size": 3')
    cfg = load_config(write_config(tmp_path, (prepared, 300), name="torn", model=dict(TINY_MODEL),
                                   early_stop={"patience": 2, "metric": "val_reward_accuracy"}))
    problems, _, _ = _check_prepared_dir(cfg)
    assert not any("needs a preference corpus" in p for p in problems), problems


def test_warnings_rising_gap_and_probe():
    evals = [{"kind": "eval", "step": s, "epoch": s, "val_loss": v, "probe_loss": p}
             for s, v, p in ((1, 2.0, 3.0), (2, 1.8, 3.1), (3, 1.9, 3.3), (4, 2.1, 3.9))]
    trains = [{"kind": "train", "step": 4, "epoch": 4, "loss": x} for x in (0.1, 2.4, 0.05)]
    found = warnings(evals + trains, warn_rising=2, warn_gap=0.5)
    assert any("val loss rising for 2 evals (1.8000 -> 2.1000" in w for w in found), found
    assert any("train/val gap 1.250 > 0.5 in epoch 4" in w for w in found), found
    assert any("probe loss rising: 3.0000 -> 3.9000" in w for w in found), found
    assert warnings(evals[:2], warn_rising=2, warn_gap=0.5) == []


def test_status_per_epoch_counts_each_step_once_the_last_attempt_winning(tmp_path):
    """Issue 39: a resume that logged steps 1-15 again read "30 logs" (and both attempts' losses mixed)."""
    def train(step, loss):
        return {"kind": "train", "step": step, "epoch": 0, "loss": loss}

    first = [train(s, 9.0) for s in range(1, 16)] + [{"kind": "eval", "step": 15, "epoch": 0, "val_loss": 8.0}]
    again = [train(s, 2.0 + s / 100) for s in range(1, 16)] + [
        {"kind": "eval", "step": 15, "epoch": 0, "val_loss": 3.0}, train(16, 2.0 + 16 / 100)]
    (tmp_path / names.METRICS).write_text("".join(json.dumps(r) + "\n" for r in first + again))
    line = next(x for x in fit_lines(tmp_path) if "epoch 0:" in x)
    assert "16 logs" in line and "per-batch 2.010..2.160" in line and "val 3.0000" in line, line


def test_status_says_the_best_of_the_metric_the_early_stop_followed(tmp_path):
    stop = {"kind": "early_stop", "step": 40, "best_step": 12, "metric": "val_reward_accuracy",
            "best_val_reward_accuracy": 0.84375, "patience": 4}
    lines = [{"kind": "train", "step": 40, "epoch": 0, "loss": 0.4}, {"kind": "eval", "step": 40, "epoch": 0,
                                                                      "val_loss": 0.5}, stop]
    (tmp_path / names.METRICS).write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert ("  early stop at step 40: best val reward accuracy 0.8438 at step 12 (the checkpoint BEST names)"
            in fit_lines(tmp_path))
    older = {"kind": "early_stop", "step": 40, "best_step": 12, "best_val_loss": 0.5, "patience": 4}  # no metric
    (tmp_path / names.METRICS).write_text("".join(json.dumps(r) + "\n" for r in lines[:2] + [older]))
    assert "  early stop at step 40: best val loss 0.5000 at step 12 (the checkpoint BEST names)" in fit_lines(tmp_path)


@pytest.mark.parametrize("patience", [2, 0])
def test_status_names_best_when_a_run_with_early_stop_ends_on_another_step(tmp_path, patience):
    """Found by a new user: a LoRA run with [early_stop] patience = 2 trained its whole budget (its val loss kept
    improving but for the last validation), BEST named step 680, and status said nothing of it: its last line was
    `epoch 2: ... val 7.5595` of step 699, while a stage whose init.from names the run starts from BEST (its default
    init.checkpoint = "best"). Without [early_stop] there is no BEST, and nothing is said."""
    records = [{"kind": "train", "step": 699, "epoch": 2, "loss": 7.58}]
    for step, val in ((640, 7.5612), (680, 7.5579), (699, 7.5595)):
        records.append({"kind": "eval", "step": step, "epoch": 2, "val_loss": val, "best_val_loss": min(val, 7.5579)
                        if step >= 680 else val})
    (tmp_path / names.METRICS).write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / names.RUN_CONFIG_COPY).write_text(  # a whole config, as a supervisor's copy is (load_config)
        f'[run]\nname = "r"\ndir = "{tmp_path}"\n[data]\nprepared = "/nowhere"\n[train]\nmax_steps = 699\n'
        f"[early_stop]\npatience = {patience}\n")
    best = [line for line in fit_lines(tmp_path) if "BEST" in line]
    if patience:
        assert best == ["  best val loss 7.5579 at step 680 (the checkpoint BEST names; a later stage's init.from "
                        "takes it by default, not step 699)"], best
    else:
        assert best == [], best


def test_status_names_best_by_the_step_the_trainer_logged_not_by_a_value_an_earlier_step_scored_too(tmp_path):
    """Each eval line carries `best_step`. A DPO run's reward accuracy takes few values (multiples of 1/64 here):
    one resumed after early_stop.metric changed back counts its best anew (load_state_dict), and the 0.75 of step 4,
    before the resume, is not the best of step 12's 0.75, which BEST names. Matching the value named step 4; a line
    from before best_step (no such field) is still read by its value."""
    metric = "val_reward_accuracy"
    evals = [(4, 0.75, 4), (8, 0.6875, 8), (12, 0.75, 12), (16, 0.71875, 12)]  # (step, accuracy, best_step)
    records = [{"kind": "train", "step": 16, "epoch": 0, "loss": 0.5}]
    records += [{"kind": "eval", "step": step, "epoch": 0, "val_loss": 0.6, metric: acc,
                 f"best_{metric}": 0.75 if step != 8 else acc, "best_step": best} for step, acc, best in evals]
    (tmp_path / names.METRICS).write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / names.RUN_CONFIG_COPY).write_text(
        f'[run]\nname = "r"\ndir = "{tmp_path}"\n[data]\nprepared = "/nowhere"\n[train]\nmax_steps = 16\n'
        f'[early_stop]\npatience = 8\nmetric = "{metric}"\n')
    best = [line for line in fit_lines(tmp_path) if "BEST" in line]
    assert best == ["  best val reward accuracy 0.7500 at step 12 (the checkpoint BEST names; a later stage's "
                    "init.from takes it by default, not step 16)"], best
    for r in records:
        r.pop("best_step", None)  # an older log: the first validation that scored the best
    (tmp_path / names.METRICS).write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [line for line in fit_lines(tmp_path) if "BEST" in line][0].startswith(
        "  best val reward accuracy 0.7500 at step 4 "), fit_lines(tmp_path)


@pytest.mark.slow
def test_a_tiny_corpus_overfits_stops_itself_and_keeps_its_best(tmp_path):
    tiny, vocab = real_text_prepared(tmp_path / "tiny", n_docs=80, vocab_size=300)  # 72 reviews to learn by heart
    config = write_config(tmp_path, (tiny, vocab), name="overfit", model=dict(TINY_MODEL),
                          data={"mode": "padded", "prepared": str(tiny)},
                          train={"seq_len": 64, "max_steps": 0, "max_epochs": 80, "lr": 1.5e-2, "min_lr_ratio": 1.0,
                                 "warmup_steps": 0, "eval_every": 0, "checkpoint_every": 40, "log_every": 2,
                                 "device": "cpu"},
                          early_stop={"patience": 3}, eval={"warn_rising": 2, "warn_gap": 0.5})
    assert run_supervisor(config, tmp_path, timeout=240, fake=False) == 0
    cfg = load_config(config)
    records = read_metrics(cfg.run_dir)
    stop = next(r for r in records if r["kind"] == "early_stop")
    evals = [r for r in records if r["kind"] == "eval"]
    total = next(r["total_steps"] for r in records if r["kind"] == "train")
    assert stop["step"] < total / 2, (stop, total)  # it stopped itself, long before its 80 epochs
    best = min(evals, key=lambda r: r["val_loss"])
    assert stop["best_step"] == best["step"] and stop["best_val_loss"] == pytest.approx(best["val_loss"], abs=1e-6)
    assert len({r["epoch"] for r in evals}) == len(evals) >= 4  # one validation per epoch's end
    for root in (cfg.checkpoint_dir, cfg.run.remote):
        name = checkpoint_dirs.read_best(root)
        assert name == f"step-{best['step']:08d}", (root, name)
        assert ck.validate(f"{root}/{name}")["early_stop"]["best_step"] == best["step"]
    assert checkpoint_dirs.read_latest(cfg.run.remote) == f"step-{stop['step']:08d}"  # the final sync: the last one too

    # status warned before the stop: at the validation before it, the records already showed overfitting
    before = [r for r in records if r["step"] <= evals[-2]["step"] and r["kind"] in ("train", "eval")]
    assert warnings(before, warn_rising=2, warn_gap=0.5), before[-3:]
    shown = cli("status", str(cfg.run_dir), fake=False).stdout
    assert "WARNING: train/val gap" in shown and "per-batch" in shown and "early stop at step" in shown, shown

    out = cli("export", f"{cfg.run.remote}/{BEST}", "--format", "hf", "--out", str(tmp_path / "best-hf"),
              fake=False)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "best-hf" / "config.json").read_text())["hidden_size"] == TINY_MODEL["hidden_size"]


@pytest.mark.slow  # a real DPO run
def test_a_dpo_run_keeps_its_best_reward_accuracy_as_best_for_the_next_stage(tmp_path, dpo_corpus):
    """early_stop.metric = "val_reward_accuracy": each eval line carries the best so far, BEST names the checkpoint
    of the highest val reward accuracy (the first of equals; 0.56 at step 4 where the lowest val loss is at step 8,
    measured), and a later stage's `init.checkpoint = "best"` takes it."""
    from in_process import train_in_process
    from minilmd.init_source import resolve
    from minilmd.protocol import EXIT_DONE
    from trainer_corpus import run_paths

    config = write_config(tmp_path, dpo_corpus, name="dpo", data={"val_windows": 64},
                          train={"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, "lr": 1e-2, "max_steps": 24,
                                 "eval_every": 4, "checkpoint_every": 100, "log_every": 4},
                          early_stop={"patience": 20, "metric": "val_reward_accuracy"})
    p = train_in_process(config)
    assert p.returncode == EXIT_DONE, p.stderr
    run_dir, ckpt_dir = run_paths(config)
    evals = read_metrics(run_dir, "eval")
    assert [e["step"] for e in evals] == [4, 8, 12, 16, 20, 24]
    accuracies = [e["val_reward_accuracy"] for e in evals]
    assert [e["best_val_reward_accuracy"] for e in evals] == [max(accuracies[:i + 1]) for i in range(len(evals))]
    firsts = [evals[accuracies.index(max(accuracies[:i + 1]))]["step"] for i in range(len(evals))]
    assert [e["best_step"] for e in evals] == firsts, evals  # the step of each line's best: the first that scored it
    best = evals[accuracies.index(max(accuracies))]
    losses = [e["val_loss"] for e in evals]
    assert evals[losses.index(min(losses))]["step"] != best["step"], evals  # BEST follows the metric, not the loss
    assert checkpoint_dirs.read_best(ckpt_dir) == f"step-{best['step']:08d}", evals
    assert resolve(str(ckpt_dir), "best").path.name == f"step-{best['step']:08d}"
    assert ck.validate(ckpt_dir / f"step-{best['step']:08d}")["early_stop"]["metric"] == "val_reward_accuracy"


@pytest.mark.slow  # a real DPO run
def test_a_dpo_run_watches_forgetting_with_the_probes_next_token_loss(tmp_path, small_dpo_corpus, chat_corpus):
    """[eval] probe on a DPO run (what the update-share warning advises): the earlier stage's val split is scored by
    its next-token loss, as on every other run (the DPO objective needs pairs and their reference, which a probe
    has not: the first validation crashed the run), so forgetting means the same thing for pairs."""
    from in_process import train_in_process
    from minilmd.protocol import EXIT_DONE
    from trainer_corpus import run_paths

    config = write_config(tmp_path, small_dpo_corpus, name="dpo", data={"val_windows": 16},
                          eval={"probe": str(chat_corpus[0])},
                          train={"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, "lr": 1e-3, "max_steps": 4,
                                 "eval_every": 2, "checkpoint_every": 100})
    p = train_in_process(config)
    assert p.returncode == EXIT_DONE, p.stderr
    evals = read_metrics(run_paths(config)[0], "eval")
    assert [e["step"] for e in evals] == [2, 4]
    # a cross-entropy over a vocabulary of a few hundred (ln 300 = 5.7), not a DPO loss near ln 2
    assert all(3.0 < e["probe_loss"] < 8.0 for e in evals), evals


# an 8-epoch DPO run on the tests' pairs that overfit, measured: (epoch mean train loss, val loss, val accuracy)
OVERFIT_DPO = [(0.6256, 0.413052, 0.875), (0.3775, 0.208275, 0.921875), (0.1244, 0.245594, 0.84375),
               (0.2143, 0.210619, 0.84375), (0.1842, 0.225788, 0.859375), (0.1361, 0.271044, 0.84375),
               (0.1011, 0.278369, 0.859375), (0.1177, 0.278727, 0.859375)]


def test_the_gap_warning_of_a_dpo_run_is_on_the_dpo_losss_scale_unless_the_config_sets_it(tmp_path):
    """A DPO loss starts at ln 2: the measured run's gaps (0.12 to 0.18 from epoch 2, its val loss rising from its
    lowest and its val reward accuracy falling) never reach eval.warn_gap's 0.5; a DPO run whose config leaves
    warn_gap out is warned at DPO_WARN_GAP. The same losses without rewards, or a config that sets 0.5, are not."""
    def write(run_dir, dpo: bool, config: str):
        run_dir.mkdir()
        lines = []
        for epoch, (train_loss, val, accuracy) in enumerate(OVERFIT_DPO):
            lines += [{"kind": "train", "step": 86 * epoch + s, "epoch": epoch, "loss": train_loss} for s in (40, 80)]
            lines.append({"kind": "eval", "step": 86 * (epoch + 1), "epoch": epoch, "val_loss": val,
                          **({"val_reward_accuracy": accuracy, "val_reward_margin": 1.0, "val_reward_chosen": 0.1,
                              "val_reward_rejected": -0.9} if dpo else {})})
        (run_dir / names.METRICS).write_text("".join(json.dumps(r) + "\n" for r in lines))
        (run_dir / names.RUN_CONFIG_COPY).write_text(  # a whole config, as a supervisor's copy is (load_config)
            f'[run]\nname = "r"\ndir = "{run_dir}"\n[data]\nprepared = "/nowhere"\n[train]\nmax_steps = 10\n'
            + config)
        return [line for line in fit_lines(run_dir) if "train/val gap" in line]

    assert write(tmp_path / "dpo", True, "[eval]\nwarn_rising = 3\n") == [
        "  WARNING: train/val gap 0.161 > 0.1 in epoch 7 (train 0.1177, val 0.2787; grown from -0.213 in epoch 0)"]
    assert write(tmp_path / "set", True, "[eval]\nwarn_gap = 0.5\n") == []
    assert write(tmp_path / "text", False, "") == []


def test_a_dpo_run_warns_of_forgetting_at_the_usual_probe_rise_not_at_the_dpo_gap(tmp_path):
    """The probe is scored by its next-token loss on every run (3 to 5 after SFT): DPO_WARN_GAP, on the DPO loss's
    scale, is for the train/val gap alone; a probe rising 3.00 -> 3.15 is no more a warning on a DPO run than on
    another, and one rising past eval.warn_gap's default is one on both."""
    def shown(name: str, probes: list[float]) -> list[str]:
        run_dir = tmp_path / name
        run_dir.mkdir()
        lines = [{"kind": "eval", "step": 10 * (i + 1), "epoch": 0, "val_loss": 0.6, "probe_loss": p,
                  "val_reward_accuracy": 0.8, "val_reward_margin": 0.5, "val_reward_chosen": 0.1,
                  "val_reward_rejected": -0.4} for i, p in enumerate(probes)]
        (run_dir / names.METRICS).write_text("".join(json.dumps(r) + "\n" for r in lines))
        (run_dir / names.RUN_CONFIG_COPY).write_text("")
        return [line for line in fit_lines(run_dir) if "probe loss rising" in line]

    assert shown("small", [3.0, 3.1, 3.15]) == []
    assert shown("large", [3.0, 3.3, 3.6]) == [
        "  WARNING: probe loss rising: 3.0000 -> 3.6000 (forgetting the earlier stage)"]
