"""`run --check` states the budget of a valid config in one line (minilmd/plan/budget.py budget_line): its steps,
rows and tokens, the epochs of train they are, which budget binds when several are set and what each other would
be, and the time only at a rate this run directory measured before (user report 6, finding 6: --check printed only
the lr, and the missing-budget message said "takes 0.0 h" of a small corpus). Figures checked against hand counts."""
from __future__ import annotations

from minilmd.config import config_from_dict
from minilmd.config_values import budget_problem
from minilmd.plan.budget import Rate, budget_line, planned
from minilmd.plan.trainer_state import Trained
from supervisor_helpers import cli, write_config

TEXT = {"data_format": "text", "splits": {"train": {"documents": 1_000, "tokens": 1_000_000}}}
"""A packed text corpus of (1,000,000 - 512 + 1) // 512 = 1,952 windows of 512 tokens."""
CHAT = {"data_format": "chat", "splits": {"train": {"documents": 1_000, "tokens": 300_000}}}
"""A chat corpus, bucketed (SFT's default): 1,000 // 16 = 62 full buckets of 16, 992 conversations an epoch."""


def config(tmp_path, **train):
    """512 tokens x 16 rows x 4 accumulations on one CPU rank: 64 rows, 32,768 tokens a step."""
    return config_from_dict({
        "run": {"name": "b", "dir": str(tmp_path / "run")},
        "data": {"prepared": str(tmp_path / "corpus")},
        "train": {"device": "cpu", "seq_len": 512, "micro_batch_size": 16, "grad_accum": 4, **train},
    })


def test_one_budget_is_said_with_its_tokens_and_epochs(tmp_path):
    cfg = config(tmp_path, max_steps=60)
    line = budget_line(cfg, planned(cfg, TEXT))
    # 60 x 64 = 3,840 rows x 512 = 1,966,080 tokens; 3,840 / 1,952 windows = 1.97 epochs
    assert line.startswith("budget: 60 steps x 64 rows x 512 tokens = 2.0 M tokens = 1.97 epochs of train "
                           "(train.max_steps = 60); no time estimate before a launch has measured"), line


def test_the_budget_that_ends_first_binds_and_the_others_are_counted(tmp_path):
    cfg = config(tmp_path, max_steps=60, max_epochs=3.0, max_tokens=1_000_000)
    line = budget_line(cfg, planned(cfg, TEXT))
    # max_tokens: ceil(1,000,000 / 32,768) = 31 steps; max_epochs: ceil(3 x 1,952 / 64) = 92 steps
    assert line.startswith("budget: 31 steps x 64 rows x 512 tokens = 1.0 M tokens = 1.02 epochs of train "
                           "(train.max_tokens binds; train.max_steps = 60 would be 60 steps; train.max_epochs = 3 "
                           "would be 92 steps)"), line
    epochs = config(tmp_path, max_steps=1_200, max_epochs=3.0)
    assert "(train.max_epochs binds; train.max_steps = 1,200 would be 1,200 steps)" in \
        budget_line(epochs, planned(epochs, TEXT))


def test_a_chat_corpus_counts_its_rows_as_conversations_and_its_tokens_as_positions(tmp_path):
    cfg = config(tmp_path, max_epochs=2.0)
    line = budget_line(cfg, planned(cfg, CHAT))
    # ceil(2 x 992 / 64) = 31 steps = 1,984 rows = 2.00 epochs; 1,984 x 512 = 1,015,808 positions, padding counted
    assert line.startswith("budget: 31 steps x 64 rows x 512 tokens = 1.0 M token positions = 2.00 epochs of train "
                           "(train.max_epochs = 2)"), line


def test_a_preference_corpus_counts_pairs_and_each_sides_positions(tmp_path):
    cfg = config(tmp_path, max_steps=10)
    dpo = {"data_format": "dpo", "splits": {"train": {"documents": 2_000, "tokens": 600_000}}}
    # 1,000 pairs in 62 full buckets of 16: 992 pairs an epoch; 10 x 64 = 640 pairs = 0.65 epochs
    assert budget_line(cfg, planned(cfg, dpo)).startswith(
        "budget: 10 steps x 64 pairs x 512 tokens = 327,680 token positions a side = 0.65 epochs of train")


def test_an_epoch_budget_of_a_corpus_not_readable_here_is_said_uncounted(tmp_path):
    only = config(tmp_path, max_epochs=2.0)
    assert planned(only, {}) is None
    assert budget_line(only, None).startswith("budget: train.max_epochs = 2 of ")
    both = config(tmp_path, max_steps=60, max_epochs=2.0)
    line = budget_line(both, planned(both, {}))
    assert line.startswith("budget: 60 steps x 64 rows x 512 tokens = 2.0 M tokens (train.max_steps binds; "
                           "train.max_epochs = 2 is not counted: the corpus's size is not readable here)"), line


def test_the_time_is_said_only_at_a_measured_rate(tmp_path):
    cfg = config(tmp_path, max_steps=60)
    plan = planned(cfg, TEXT)
    # 60 steps x 32,768 tokens at 32,768 tok/s: a minute
    assert budget_line(cfg, plan, Rate(32_768.0)).endswith("; all of it take about 60s at the 32,768 tok/s this run "
                                                           "last measured")
    # 50 steps left; the run trained 16,384 real tokens a step (tokens_seen / step): 50 x 16,384 / 3,276.8 = 250 s
    assert budget_line(cfg, plan, Rate(3_276.8, step=10, tokens_seen=163_840, at=10)).endswith(
        "; the 50 steps left take about 4m at the 3,277 tok/s this run last measured")
    # where the launch resumes is not known: counted from the last step recorded, said so
    assert budget_line(cfg, plan, Rate(3_276.8, step=10, tokens_seen=163_840)).endswith(
        "; the 50 steps left after step 10 (the last known: where the launch resumes is not known) take about 4m "
        "at the 3,277 tok/s this run last measured")
    assert budget_line(cfg, plan, Rate(3_276.8, step=60)).endswith("; none of it is left")


def test_the_steps_left_count_from_the_step_the_launch_resumes_not_the_last_recorded(tmp_path):
    """user9 F11: scratch lost step 53 (the last state.json recorded), the launch resumes the remote's 35: 25 steps
    are left, not 7."""
    cfg = config(tmp_path, max_steps=60)
    plan = planned(cfg, TEXT)
    line = budget_line(cfg, plan, Rate(3_276.8, step=53, tokens_seen=53 * 16_384, at=35))
    assert line.endswith("; the 25 steps left take about 2m at the 3,277 tok/s this run last measured"), line
    assert budget_line(cfg, plan, Rate(32_768.0, step=53, at=0)).endswith("; all of it take about 60s at the "
                                                                          "32,768 tok/s this run last measured")


def test_a_resume_that_changes_the_batch_is_timed_at_todays_batch(tmp_path):
    """Found by a new user: a resume with 64 times the micro-batch was said to take "about 2m" at the measured rate,
    the old step's tokens times the steps left; at today's step it takes about 18m. The run trained 10 steps of 64
    rows x 512 positions (32,768 a step), 16,384 real tokens a step (half); today's step is 4x the rows: 131,072
    positions, 65,536 real tokens; 50 left x 65,536 / 3,276.8 tok/s = 1,000 s."""
    cfg = config(tmp_path, max_steps=60, micro_batch_size=64)
    plan = planned(cfg, TEXT, done=Trained(step=10, rows=640, positions=640 * 512))
    assert plan is not None and plan.done is not None  # the batch changed: what was trained is counted apart
    line = budget_line(cfg, plan, Rate(3_276.8, step=10, tokens_seen=163_840, at=10))
    assert line.endswith("; the 50 steps left take about 17m at the 3,277 tok/s this run last measured"), line


def test_the_missing_budget_message_says_a_short_epoch_in_seconds(tmp_path):
    cfg = config(tmp_path, max_steps=1)
    cfg.train.max_steps = 0  # the config check would refuse it with this message
    assert "at the reference run's measured 3,700 tok/s takes 27s, so" in budget_problem(cfg, 100_000)


def test_run_check_prints_the_budget_line(tmp_path, corpus):
    config_path = write_config(tmp_path, corpus, train={"max_steps": 30, "max_epochs": 100.0})
    out = cli("run", "--check", str(config_path))
    assert out.returncode == 0, out.stdout + out.stderr
    [line] = [line for line in out.stdout.splitlines() if line.startswith("budget: ")]
    assert line.startswith("budget: 30 steps x 4 rows x 32 tokens = 3,840 tokens = ") and \
        "(train.max_steps binds; train.max_epochs = 100 would be " in line, line


def test_the_done_line_names_a_token_budget_as_the_config_gives_it(tmp_path):
    """"run is done ...: raise the budget (train.max_tokens = 3,000,000)": before (user report 9, finding 11) the
    done line said `train.max_tokens = 3e+06`, a number no one wrote in a config."""
    from minilmd.daemon.jobs.rundone import _budget

    assert _budget(config(tmp_path, max_tokens=3_000_000, max_epochs=1.5)) == \
        "train.max_tokens = 3,000,000 and train.max_epochs = 1.5"
    assert _budget(config(tmp_path, max_steps=100)) == "train.max_steps = 100"
