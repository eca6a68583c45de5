"""`minilmd run --check` catches what a launch would hit, and the launch refuses the same things the same way:
exit 2, final, before anything is staged or started. Each observation goes through `minilmd run CONFIG --check` and
through a real `minilmd run` (with the fake trainer behind it: a launch that got past the checks would train):

- every number finite and in its range (one table, config_values.RANGES), every problem at once;
- model.vocab_size other than the prepared corpus's vocabulary (its meta.json);
- an empty val split;
- scratch too small for the corpus plus the staged probe val split and init.from copy plus the checkpoints kept
  between syncs, the whole sum in the refusal, margin included; the same refusal from staging itself (space taken
  after the launch's check) is final too;
- scratch not writable by this user (a real second user, nobody);
- a ValueError from the optimizer, on a value the config check cannot see, makes the real trainer exit 2, which the
  supervisor takes as final: one attempt, not restart.no_progress_limit of them.
"""
from __future__ import annotations

import math
import os
import re
import signal
import sys
from dataclasses import fields
from pathlib import Path
from typing import get_type_hints

import numpy as np
import pytest
import tomllib

from minilmd.config import ConfigError, RunConfig, config_from_dict, load_config
from minilmd.config_values import INT64_MAX, MAX_DURATION_S, RANGES, STEPS_OR_DURATION, Duration
from minilmd.daemon.jobs import scratch_room
from minilmd.daemon.supervisor import Supervisor
from minilmd.model_shapes import expected_state_shapes
from minilmd.probes import checked_from_dict
from minilmd.protocol import SUPERVISOR_CONFIG
from scratch_helpers import owned_by_nobody, readable_copy, two_users  # noqa: F401
from supervisor_helpers import cli, events, state, write_config
from trainer_corpus import write_prepared

REFUSING_OPTIMIZER = Path(__file__).with_name("refusing_optimizer.py")


def check_and_launch(config: Path) -> tuple:
    """(`minilmd run --check CONFIG`, `minilmd run CONFIG`) as finished processes."""
    return cli("run", "--check", str(config)), cli("run", str(config), timeout=120)


def assert_refused_before_anything(config: Path, *fragments: str) -> str:
    """--check and the launch both exit 2 naming every fragment; the launch created no run directory (so no
    attempt, no restart) and staged nothing."""
    run = tomllib.loads(config.read_text(encoding="utf-8"))["run"]
    run_dir, scratch = Path(run["dir"]), Path(run["scratch"])
    checked, launched = check_and_launch(config)
    for out in (checked, launched):
        text = out.stdout + out.stderr
        assert out.returncode == SUPERVISOR_CONFIG, text
        missing = [f for f in fragments if f not in text]
        assert not missing, f"missing {missing} in:\n{text}"
        assert "Traceback" not in text
    assert not run_dir.exists()
    assert not (scratch / "corpus").exists()
    return checked.stdout + checked.stderr


# --- numbers ------------------------------------------------------------------------------------------------------
def numeric_fields() -> dict[str, object]:
    hints = get_type_hints(RunConfig)
    found = {}
    for section in (f.name for f in fields(RunConfig) if f.name != "source"):
        for name, kind in get_type_hints(hints[section]).items():
            if kind in (int, float, Duration):
                found[f"{section}.{name}"] = kind
    return found


def test_every_number_of_the_schema_has_its_range():
    assert set(numeric_fields()) == set(RANGES)


def test_every_count_is_int64_every_duration_a_week_at_most_and_every_float_finite():
    """The one rule of the upper bounds (RANGES): a count is stored as int64, a duration past a week is a slip."""
    kinds = numeric_fields()
    for key, (allowed, _) in RANGES.items():
        if kinds[key] is int or key in (*STEPS_OR_DURATION, "train.max_epochs"):
            assert allowed.high <= (2 ** 64 - 1 if key == "train.seed" else INT64_MAX), key  # the seed: uint64
        elif kinds[key] is Duration:
            assert allowed.high <= MAX_DURATION_S, key
        assert not allowed.holds(math.inf) and not allowed.holds(math.nan), key


def test_the_absurd_budgets_and_durations_of_a_new_users_walk_are_all_refused_at_once(tmp_path):
    raw = minimal(tmp_path)
    raw["train"] = {"max_steps": 99999999999999999999, "max_tokens": 99999999999999999999999, "max_epochs": 1e300,
                    "checkpoint_every": 99999999999999999999}
    raw["sync"] = {"every": "99999999h", "keep": 99999999999999999999}
    raw["restart"] = {"hang_timeout": "30d"}
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert sorted(p.split(" = ")[0] for p in err.value.problems) == [
        "restart.hang_timeout", "sync.every", "sync.keep", "train.checkpoint_every", "train.max_epochs",
        "train.max_steps", "train.max_tokens"], err.value.problems
    said = "\n".join(err.value.problems)
    assert (f"train.max_steps = 99999999999999999999: must be within [0, {INT64_MAX}] (0: not set; a count is stored "
            f"as int64)") in said
    assert "sync.every = '99999999h': must be within (0, 7d] (a week at most: " in said
    assert "train.max_epochs = 1e+300: must be finite and within [0, " in said
    raw["train"]["checkpoint_every"] = "8d"  # a duration: a week at most, as an integer: steps
    with pytest.raises(ConfigError, match=r"train.checkpoint_every = '8d': must be within \(0, 7d\]"):
        config_from_dict(raw)
    ok = minimal(tmp_path)
    ok["train"] = {"max_steps": INT64_MAX, "checkpoint_every": 10 ** 12}
    ok["sync"] = {"every": "7d"}
    config_from_dict(ok)


def out_of_range_values(key: str) -> list:
    allowed, _ = RANGES[key]
    kind = numeric_fields()[key]
    if key in STEPS_OR_DURATION:  # an integer counts steps, anything else is a duration
        return [0, -1, INT64_MAX + 1, 0.0, MAX_DURATION_S + 0.5, "8d", math.nan, math.inf]
    values = [allowed.low - 1 if kind is int else allowed.low - 0.5]
    if allowed.low_open:
        values.append(int(allowed.low) if kind is int else float(allowed.low))
    if not math.isinf(allowed.high):
        values.append(int(allowed.high) + 1 if kind is int else allowed.high + 0.5)
    if kind is not int:
        values += [math.nan, math.inf]
    return values


def minimal(tmp_path: Path) -> dict:
    return {"run": {"name": "n", "dir": str(tmp_path / "run")}, "data": {"prepared": str(tmp_path / "p")},
            "train": {"max_steps": 10}}


@pytest.mark.parametrize("key", sorted(RANGES))
def test_each_number_outside_its_range_is_refused(tmp_path, key):
    section, name = key.split(".")
    for value in out_of_range_values(key):
        raw = minimal(tmp_path)
        raw.setdefault(section, {})[name] = value
        with pytest.raises(ConfigError) as err:
            config_from_dict(raw)
        assert any(p.startswith(f"{key} = ") and "must be" in p for p in err.value.problems), (value, err.value)


@pytest.mark.slow
def test_the_numbers_seen_in_restart_loops_are_all_refused_at_once(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False,
                          train={"lr": math.nan, "grad_clip": math.inf},
                          model={"rope_theta": -1.0, "rms_norm_eps": -1e-6},
                          sync={"every": 0},
                          restart={"backoff_max": 0, "hang_timeout": math.nan})
    text = assert_refused_before_anything(
        config, "train.lr = nan: must be finite and within [0, 1]", "train.grad_clip = inf: must be finite and >= 0",
        "model.rope_theta = -1.0: must be finite and > 0", "model.rms_norm_eps = -1e-06",
        "sync.every = 0: must be within (0, 7d]", "restart.backoff_max = 0: must be within (0, 7d]",
        "restart.hang_timeout = nan: must be finite and within (0, 7d]")
    assert "7 problem(s)" in text


@pytest.mark.parametrize("key", sorted(RANGES))
def test_each_number_of_the_wrong_type_is_named_and_hides_no_other_check(tmp_path, key):
    """Every number of the schema written with the wrong type (a string for a count or a float, a bool for a
    duration) is one problem naming the field and the type expected, and the checks that do not read it still say
    theirs (the corpus that is not there, the remote's unknown protocol). On main a count's or the model's wrong type
    hid both (the checks on the machine waited for every budget, [model] and [data] field)."""
    section, name = key.split(".")
    raw = minimal(tmp_path)
    raw["run"]["remote"] = "nosuchproto://bucket/x"
    wrong = True if numeric_fields()[key] is Duration else "1"
    raw.setdefault(section, {})[name] = wrong
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    typed, *others = err.value.problems
    assert typed.startswith(f"{key} = {wrong!r}: expected "), err.value.problems
    assert [p.split(" = ")[0] for p in others] == ["data.prepared", "run.remote"], err.value.problems


@pytest.mark.slow
def test_a_mistyped_budget_hides_none_of_the_launchs_other_refusals(tmp_path, corpus):
    """train.max_steps = "30" (quoted) through `minilmd run --check` and the launch: exit 2, the field and the type
    named with how to write it, and the problems that do not derive from the budget said beside it: a model
    vocabulary other than the corpus's, a remote of an unknown protocol. On main the type problem came alone."""
    _, vocab = corpus
    config = write_config(tmp_path, corpus, remote=False, train={"max_steps": "30"}, model={"vocab_size": vocab - 12},
                          run={"remote": "nosuchproto://bucket/x"})
    text = assert_refused_before_anything(
        config, "train.max_steps = '30': expected an integer: write max_steps = 30 (no quotes)",
        f"model.vocab_size = {vocab - 12} but the corpus", "run.remote = 'nosuchproto://bucket/x': unknown protocol")
    assert "3 problem(s)" in text and "a budget is required" not in text


@pytest.mark.slow
def test_a_zero_hang_timeout_is_refused_not_killed_as_a_hang_five_times(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False, restart={"hang_timeout": 0})
    assert_refused_before_anything(config, "restart.hang_timeout = 0: must be within (0, 7d] (0 would kill every "
                                           "attempt as hung)")


# --- the corpus against the model ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_model_vocabulary_other_than_the_corpus_is_refused_before_staging(tmp_path, corpus):
    _, vocab = corpus
    config = write_config(tmp_path, corpus, remote=False, model={"vocab_size": vocab - 12})
    assert_refused_before_anything(config, f"model.vocab_size = {vocab - 12} but the corpus",
                                   f"tokenized with a vocabulary of {vocab}", f"set model.vocab_size = {vocab}")


def empty_val_copy(corpus: tuple[Path, int], dest: Path) -> Path:
    """The corpus with every document in train and none in val."""
    root, vocab = corpus
    tokens = np.fromfile(root / "train" / "tokens.bin", dtype="<u2")
    docs, start = [], 0
    for length in np.load(root / "train" / "doc_lengths.npy"):
        docs.append(tokens[start + 1:start + length - 1].tolist())  # without BOS and EOS: write_prepared adds them
        start += int(length)
    return write_prepared(dest, docs, [], vocab, root / "tokenizer.json")


@pytest.mark.slow
def test_an_empty_val_split_is_refused_before_staging(tmp_path, corpus):
    prepared = empty_val_copy(corpus, tmp_path / "no-val")
    config = write_config(tmp_path, (prepared, corpus[1]), remote=False)
    assert_refused_before_anything(config, "its val split is empty (0 documents, 0 tokens)", "--val-fraction")


# --- scratch: space -------------------------------------------------------------------------------------------------
MIDDLE_MODEL = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 256}
"""Checkpoints of about 6 MB: three of them do not fit where the corpus and the margin do."""


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def mb(n: float) -> float:
    return round(n / 1e6, 1)


def numbers(text: str, pattern: str) -> list[float]:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in:\n{text}"
    return [float(g.replace(",", "")) for g in m.groups()]


@pytest.mark.slow
def test_scratch_too_small_for_the_corpus_and_its_checkpoints_is_refused_with_the_whole_sum(tmp_path, corpus,
                                                                                           small_tmpfs):
    root, vocab = corpus
    params = sum(math.prod(s) for s in expected_state_shapes({**MIDDLE_MODEL, "vocab_size": vocab}).values())
    corpus_bytes = tree_bytes(root)
    # room for the corpus, the margin and one checkpoint and a half: what staging alone used to check fits
    disk = small_tmpfs(corpus_bytes + scratch_room.SPACE_MARGIN + 18 * params)
    config = write_config(tmp_path, corpus, remote=False, model=MIDDLE_MODEL, run={"scratch": str(disk / "s")})
    text = assert_refused_before_anything(config, "for 3 checkpoints of", "train.keep_local 2 + 1 being written",
                                          "a 64 MiB margin (67.1 MB)", "(tmpfs) has", "set run.scratch to")
    corpus_mb, all_mb, count, one_mb, total_mb, free_mb = numbers(
        text, r"needs ([\d,.]+) MB for the corpus \+ ([\d,.]+) MB for (\d+) checkpoints of ([\d,.]+) MB .*"
              r"\+ a 64 MiB margin \(67\.1 MB\) = ([\d,.]+) MB, but \S+ \(tmpfs\) has ([\d,.]+) MB free")
    assert corpus_mb == mb(corpus_bytes) and count == 3
    assert one_mb >= mb(12 * params) and abs(all_mb - 3 * one_mb) <= 0.2
    assert abs(total_mb - (corpus_mb + all_mb + 67.1)) <= 0.2
    st = os.statvfs(disk)
    assert free_mb == mb(st.f_bavail * st.f_frsize) and total_mb > free_mb


@pytest.mark.slow
def test_scratch_that_fits_the_corpus_but_not_the_staged_init_copy_is_refused_with_it_in_the_sum(tmp_path, corpus,
                                                                                                 small_tmpfs):
    """The staged probe val split and init.from copy count, at their sources' sizes: on main a scratch with room
    for the corpus and the checkpoints but not for the init copy passed, and staging then filled it."""
    base = tmp_path / "base.pth"
    with open(base, "wb") as f:
        f.truncate(16 * scratch_room.MIB)  # sparse: its size is what the copy will take
    plain = scratch_room.run_space_need(load_config(write_config(tmp_path, corpus, name="plain", remote=False)))
    assert plain is not None
    disk = small_tmpfs(plain.total + 8 * scratch_room.MIB)
    fits = write_config(tmp_path, corpus, name="fits", remote=False, run={"scratch": str(disk / "a")})
    assert scratch_room.run_space_problem(load_config(fits)) == []  # the corpus and its checkpoints fit
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(base)}, eval={"probe": str(corpus[0])},
                          run={"scratch": str(disk / "s")})
    text = assert_refused_before_anything(config, "MB for the corpus + ", " MB for the probe's val split + ",
                                          "16.8 MB for the staged copy of init.from + ", "set run.scratch to")
    assert text.index("for the corpus") < text.index("for the staged copy") < text.index("checkpoints of")


@pytest.mark.slow
def test_the_checkpoint_estimate_covers_a_real_checkpoint(undisturbed):
    run = undisturbed()
    cfg = load_config(run.run_dir.parent.parent / "plain.toml")  # train_undisturbed's config
    real = tree_bytes(run.checkpoint)
    estimate = scratch_room.checkpoint_bytes(cfg, (run.corpus[0] / "tokenizer.json").stat().st_size)
    assert real <= estimate <= real + scratch_room.CHECKPOINT_OVERHEAD + real // 50


@pytest.mark.slow
def test_staging_that_finds_no_room_is_final_not_retried(tmp_path, corpus, small_tmpfs, monkeypatch):
    """Staging's own check, with the launch's skipped: a scratch that can never hold the corpus (an 8 MiB tmpfs)
    ends the run with 2. (One big enough whose space others hold is waited for: tests/test_staging.py.)"""
    from supervisor_helpers import FAKE_TRAINER

    monkeypatch.setenv("MINILMD_TRAINER_CMD", f"{sys.executable} {FAKE_TRAINER}")
    disk = small_tmpfs("8m")
    config = write_config(tmp_path, corpus, remote=False, run={"scratch": str(disk / "s")},
                          restart={"no_progress_limit": 3})
    cfg = load_config(config)  # what the launch checked before the space went (the supervisor, in process)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        assert Supervisor(cfg, str(config), echo=False).run() == SUPERVISOR_CONFIG
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    st = state(cfg.run_dir)
    assert st["phase"] == "failed" and st["restarts"] == [] and st["no_progress_streak"] == 0
    failed = [e["message"] for e in events(cfg.run_dir) if e.get("new") == "failed"]
    assert len(failed) == 1 and "config error, final: ScratchTooSmall: run.scratch" in failed[0], failed
    assert "for the corpus files to copy + a 64 MiB margin (67.1 MB) =" in failed[0]
    assert not (cfg.run_dir / "logs" / "attempt-0001.log").exists()


# --- scratch: not writable by this user -------------------------------------------------------------------------------
@pytest.mark.slow
def test_scratch_this_user_cannot_write_is_refused_at_check_and_launch(corpus, two_users):
    prepared = readable_copy(corpus[0], two_users.root / "prepared")
    home = owned_by_nobody(two_users.root / "nobody")
    roots = two_users.root / "roots"  # root's own, 0755: nobody may not write into it
    roots.mkdir()
    config = write_config(home, (prepared, corpus[1]), remote=False, run={"scratch": str(roots / "scratch")})
    config.chmod(0o644)
    for args in (("run", "--check", str(config)), ("run", str(config))):
        out = two_users.minilmd("nobody", *args)
        text = out.stdout + out.stderr
        assert out.returncode == SUPERVISOR_CONFIG, text
        assert f"run.scratch = '{roots / 'scratch'}': {roots} is not writable" in text and "Traceback" not in text
    assert list(roots.iterdir()) == [] and not (home / "s" / "run").exists()


# --- the trainer: a deterministic refusal is final -------------------------------------------------------------------
@pytest.mark.slow
def test_a_valueerror_from_the_optimizer_is_a_config_error_not_a_restart_loop(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False, restart={"no_progress_limit": 3})
    cfg = load_config(config)
    out = cli("run", str(config), timeout=300, fake=False,
              MINILMD_TRAINER_CMD=f"{sys.executable} {REFUSING_OPTIMIZER}")
    assert out.returncode == SUPERVISOR_CONFIG, out.stdout[-3000:]
    assert sorted(p.name for p in (cfg.run_dir / "logs").iterdir()) == ["attempt-0001.log"]
    log = (cfg.run_dir / "logs" / "attempt-0001.log").read_text()
    assert "the model or its optimizer refused the config: Invalid learning rate" in log
    st = state(cfg.run_dir)
    assert st["restarts"] == [] and st["phase"] == "failed"
    ends = [e for e in events(cfg.run_dir) if e.get("event") == "child_exit"]
    assert [(e["cause"], e["exit"]) for e in ends] == [("config_error", 2)]
