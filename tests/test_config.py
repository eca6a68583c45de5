"""The run config: every problem reported at once, overrides, durations, the budget arithmetic."""
import json
import os

import pytest

from minilmd.config import MAX_CONFIG_BYTES, ConfigError, config_from_dict, load_config, parse_overrides
from minilmd.config_values import CHOICES, parse_duration
from minilmd.probes import checked_from_dict, load_checked


def minimal(tmp_path, **train):
    prepared = tmp_path / "prepared"
    prepared.mkdir(exist_ok=True)
    (prepared / "meta.json").write_text(json.dumps({"splits": {"train": {"tokens": 332_495_324}}}))
    return {
        "run": {"name": "r1", "dir": str(tmp_path / "run")},
        "data": {"prepared": str(prepared)},
        "train": {"max_steps": 10, **train},
    }


def _minimal_toml(tmp_path) -> str:
    return f'[run]\nname = "t"\ndir = "{tmp_path / "run"}"\n[data]\nprepared = "{tmp_path / "prepared"}"\n' \
           '[train]\nmax_steps = 10\n'


def test_minimal_config_gets_documented_defaults(tmp_path):
    cfg = checked_from_dict(minimal(tmp_path))
    assert cfg.model.ffn_size == 2432  # ceil(768 * pi / 64) * 64, MiniMind's rule
    assert cfg.model.head_dim == 96
    assert str(cfg.scratch_dir) == f"/dev/shm/minilmd-{os.geteuid()}/r1"  # per user: names.default_scratch
    assert parse_duration(cfg.sync.every) == 900.0
    assert cfg.gpu.max_used_mib == 200 and cfg.gpu.max_utilization == 0


def test_every_problem_is_reported_at_once(tmp_path):
    raw = minimal(tmp_path, seq_len="long", bogus=1)
    raw["data"]["mode"] = "pack"
    raw["nonsense"] = {}
    raw["gpu"] = {"poll_interval": "soon"}
    raw["model"] = {"hidden_size": 100, "num_attention_heads": 8}
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    text = str(err.value)
    for fragment in ("train.seq_len = 'long'", "unknown key train.bogus", "unknown section [nonsense]",
                     "data.mode = 'pack'", "gpu.poll_interval", "not divisible"):
        assert fragment in text
    assert len(err.value.problems) == 6


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_each_choice_is_taken_and_any_other_value_refused_naming_them_all(tmp_path, key):
    """One table of choices (config_values.CHOICES, beside RANGES): each is a config that loads; another value is one
    problem that names the key and every choice (true/false as TOML writes them)."""
    section, name = key.split(".")
    raw = minimal(tmp_path)
    for choice in CHOICES[key][0]:
        raw.setdefault(section, {})[name] = choice
        assert getattr(getattr(config_from_dict(raw), section), name) == choice
    raw[section][name] = "neither"
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    [problem] = err.value.problems
    spelled = [str(c).lower() if isinstance(c, bool) else f'"{c}"' for c in CHOICES[key][0]]
    assert problem.startswith(f"{key} = 'neither': must be ") and all(c in problem for c in spelled), problem


def test_missing_budget_shows_the_arithmetic(tmp_path):
    raw = minimal(tmp_path)
    del raw["train"]["max_steps"]
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    msg = str(err.value)
    assert "10,880 tokens" in msg  # 340 x 32 x 1 x 1
    assert "332,495,324 train tokens" in msg and "takes 25.0h," in msg
    assert "steps" not in msg.split("tokens;")[-1]  # an epoch's steps are the plan's (tests/test_plan_counts.py)


def test_a_budget_written_as_zero_is_said_to_be_none(tmp_path):
    """train.max_steps = 0 (0 leaves a budget unset) is named, not answered with "set train.max_steps" alone (user
    report 9); every budget key written as 0 is, and none that was left out."""
    with pytest.raises(ConfigError) as err:
        checked_from_dict(minimal(tmp_path, max_steps=0))
    [problem] = err.value.problems
    assert problem.startswith("train.max_steps = 0 is no budget (0 leaves a budget unset); a budget is required: "
                              "set a positive train.max_steps, train.max_tokens or train.max_epochs."), problem
    with pytest.raises(ConfigError) as err:
        checked_from_dict(minimal(tmp_path, max_steps=0, max_tokens=0, max_epochs=0.0))
    assert err.value.problems[0].startswith("train.max_steps = 0 and train.max_tokens = 0 and train.max_epochs = 0 "
                                            "are no budget"), err.value.problems
    raw = minimal(tmp_path)
    del raw["train"]["max_steps"]
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    assert err.value.problems[0].startswith("a budget is required: set a positive"), err.value.problems


def test_a_budget_field_of_the_wrong_type_or_range_is_its_own_only_problem(tmp_path):
    """A mistyped budget (max_steps = "400", `--set train.max_steps=abc`) or a micro_batch_size of -1 is one problem,
    the field's: no "a budget is required" derived from the default left in its place, nor "-64 tokens" a step.
    On main each came with the missing-budget message (and "One step trains 64 x -1 ... = -64 tokens")."""
    for value, said in (("400", ": write max_steps = 400 (no quotes)"), ("abc", ""), (400.0, ": write max_steps = 400"),
                        (400.5, "")):
        with pytest.raises(ConfigError) as err:
            checked_from_dict(minimal(tmp_path, max_steps=value))
        assert err.value.problems == [f"train.max_steps = {value!r}: expected an integer{said}"], err.value.problems
    raw = minimal(tmp_path, micro_batch_size=-1)
    del raw["train"]["max_steps"]
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    [problem] = err.value.problems
    assert problem.startswith("train.micro_batch_size = -1: must be"), problem
    config = tmp_path / "c.toml"
    config.write_text(_minimal_toml(tmp_path))
    with pytest.raises(ConfigError) as err:
        load_checked(config, ["train.max_steps=abc"])
    assert err.value.problems == ["train.max_steps = 'abc': expected an integer"], err.value.problems


def test_a_string_nested_too_deep_for_toml_is_a_wrong_type_not_a_traceback(tmp_path):
    """The wrong type's advice reads a string as TOML ("1000" -> write max_steps = 1000); a string of brackets nested
    deeper than tomllib recurses (a few KiB in a config, a --set) is the field's one problem, as a file nested so
    deep is "nested too deep" (config_from_bytes). Before, RecursionError came out of the check as a traceback."""
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ConfigError) as err:
        checked_from_dict(minimal(tmp_path, max_steps=deep))
    assert err.value.problems == [f"train.max_steps = {deep!r}: expected an integer"], err.value.problems[0][:200]
    config = tmp_path / "c.toml"
    config.write_text(_minimal_toml(tmp_path))
    with pytest.raises(ConfigError) as err:  # the same value given with --set: a bare string, as one not TOML
        load_checked(config, [f"train.max_steps={deep}"])
    assert err.value.problems == [f"train.max_steps = {deep!r}: expected an integer"], err.value.problems[0][:200]


def test_a_field_of_the_wrong_type_hides_none_of_the_checks_that_do_not_read_it(tmp_path):
    """A number of the wrong type is one problem naming the field and the type, and every check that does not read
    it still runs (a missing corpus, a remote of an unknown protocol); the checks that do read it wait rather than
    judge the default left in its place: seq_len = "64" beside max_position_embeddings = 128 is no "train.seq_len
    340 is larger than 128". On main the type problem came alone, or with that line about the default."""
    raw = minimal(tmp_path, max_steps="1000", seq_len="64", lr="3e-4")
    raw["data"]["prepared"] = str(tmp_path / "missing")
    raw["run"]["remote"] = "nosuchproto://bucket/x"
    raw["model"] = {"max_position_embeddings": 128, "num_attention_heads": "8"}
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    assert err.value.problems == [
        "train.max_steps = '1000': expected an integer: write max_steps = 1000 (no quotes)",
        "train.seq_len = '64': expected an integer: write seq_len = 64 (no quotes)",
        "train.lr = '3e-4': expected a number: write lr = 0.0003 (no quotes)",
        "model.num_attention_heads = '8': expected an integer: write num_attention_heads = 8 (no quotes)",
        f"data.prepared = '{tmp_path / 'missing'}': no such directory (run `minilmd prepare` first)",
        "run.remote = 'nosuchproto://bucket/x': unknown protocol 'nosuchproto' (fsspec knows: file, memory, sftp, s3, "
        "...)"], err.value.problems


def test_a_path_refused_waits_only_the_checks_that_read_it(tmp_path):
    """run.dir written `~/runs` is refused as it is, and the checks that read run.dir wait (a directory named `~`
    under the working directory is never judged); the corpus and seq_len rules, which do not, still run."""
    raw = minimal(tmp_path, seq_len=4096)
    raw["run"]["dir"] = "~/runs/r1"
    raw["model"] = {"max_position_embeddings": 2048}
    raw["log"] = {"prometheus_textfile": str(tmp_path / "nowhere" / "m.prom")}
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    first, second, third = err.value.problems
    assert first.startswith("run.dir = '~/runs/r1': TOML expands neither ~ nor $VAR"), first
    assert second == "train.seq_len 4096 is larger than model.max_position_embeddings 2048", second
    assert third.startswith("log.prometheus_textfile") and "does not exist" in third, third


def test_the_values_alone_touch_nothing_on_the_machine(tmp_path):
    """config_from_dict checks the values only: a corpus that is not there, a remote of an unknown protocol are
    minilmd/probes.py's to find, and a missing budget's message has no corpus to count."""
    raw = minimal(tmp_path)
    raw["data"]["prepared"] = str(tmp_path / "missing")
    raw["run"]["remote"] = "nosuchproto://bucket/x"
    assert config_from_dict(raw).data.prepared == str(tmp_path / "missing")
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    first, second = err.value.problems
    assert first.startswith("data.prepared = ") and "no such directory" in first
    assert second.startswith("run.remote = ") and "unknown protocol" in second
    del raw["train"]["max_steps"]
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    assert len(err.value.problems) == 1 and "332M-token corpus" in err.value.problems[0]


def test_seq_len_longer_than_the_model_allows(tmp_path):
    raw = minimal(tmp_path, seq_len=4096)
    raw["model"] = {"max_position_embeddings": 2048}
    with pytest.raises(ConfigError, match="larger than model.max_position_embeddings"):
        checked_from_dict(raw)


def test_paths_that_cannot_be_used(tmp_path):
    raw = minimal(tmp_path)
    raw["data"]["prepared"] = str(tmp_path / "missing")
    raw["run"]["remote"] = "nosuchproto://bucket/x"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    raw["run"]["scratch"] = str(blocker / "sub")
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    text = str(err.value)
    assert "no such directory" in text
    assert "unknown protocol 'nosuchproto'" in text
    assert "is a file, not a directory" in text


def test_a_chain_over_a_local_path_is_a_problem_of_the_check_for_the_remote_and_the_corpus(tmp_path):
    """Before, `simplecache::/nfs/team/remote` passed the check (a protocol fsspec knows) and the sync wrote that
    shared directory by path through fsspec, following another user's links (tests/test_urls.py)."""
    raw = minimal(tmp_path)
    raw["data"]["prepared"] = f"simplecache::{tmp_path}/corpus"
    raw["run"]["remote"] = f"filecache::file://{tmp_path}/remote"
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    first, second = err.value.problems
    assert first.startswith("data.prepared = ") and f"name {tmp_path}/corpus itself" in first
    assert second.startswith("run.remote = ") and f"name {tmp_path}/remote itself" in second


def test_unwritable_run_dir(tmp_path, read_only_dir):
    raw = minimal(tmp_path)
    raw["run"]["dir"] = str(read_only_dir / "run")
    with pytest.raises(ConfigError, match="is not writable"):
        checked_from_dict(raw)


def test_load_config_with_overrides_and_nothing_created(tmp_path):
    raw = minimal(tmp_path)
    path = tmp_path / "run.toml"
    path.write_text(
        f'[run]\nname = "r1"\ndir = "{raw["run"]["dir"]}"\n'
        f'[data]\nprepared = "{raw["data"]["prepared"]}"\n'
        "[train]\nmax_steps = 10\nmicro_batch_size = 32\n"
    )
    cfg = load_checked(path, ["train.micro_batch_size=16", "train.grad_accum=2",
                             f"data.prepared={raw['data']['prepared']}"])
    assert (cfg.train.micro_batch_size, cfg.train.grad_accum) == (16, 2)
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="not SECTION.KEY=VALUE"):
        parse_overrides(["micro_batch_size=3"])


def test_load_config_reports_file_problems(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_checked(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_checked(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nname=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_checked(bad)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # nobody writes it: an open for reading would block for ever
    with pytest.raises(ConfigError, match="unreadable.*FIFO"):
        load_config(fifo)
    with pytest.raises(ConfigError, match=r"unreadable \(over 1 MiB\)"):
        load_config(_sparse(tmp_path / "huge.toml", MAX_CONFIG_BYTES + 1))


def _sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_a_link_is_followed_for_ones_own_config_and_refused_for_another_runs_copy(tmp_path):
    """A user's config may be a link they made; a run directory's run.toml (read by status and by init.from of
    a later stage) is another run's, which may have replaced it with a link to a file of a third user."""
    (tmp_path / "real.toml").write_text(_minimal_toml(tmp_path))
    (tmp_path / "run.toml").symlink_to(tmp_path / "real.toml")
    assert load_config(tmp_path / "run.toml").run.name == "t"
    with pytest.raises(ConfigError, match="unreadable.*link"):
        load_config(tmp_path / "run.toml", untrusted=True)
    assert load_config(tmp_path / "real.toml", untrusted=True).run.name == "t"


@pytest.mark.parametrize("text,seconds", [(90, 90.0), ("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0), ("250ms", 0.25)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "-5s", -1, True, "5 minutes"])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize("every,steps,seconds", [(100, 100, None), ("5m", None, 300.0), (90.5, None, 90.5)])
def test_checkpoint_every_is_steps_as_an_integer_else_seconds(tmp_path, every, steps, seconds):
    """The one home of "an integer counts steps": the trainer's save rule and scratch's room (daemon/jobs/
    scratch_room.py) both read these two."""
    raw = minimal(tmp_path, checkpoint_every=every)
    t = config_from_dict(raw).train
    assert (t.checkpoint_every_steps, t.checkpoint_every_s) == (steps, seconds)


def test_a_checkpoint_every_that_is_no_duration_says_an_integer_counts_steps(tmp_path):
    """A new user's `"40 steps"` was told `use seconds, or a string like "90s"`: a `300` meant as five minutes saves
    every 300 steps."""
    with pytest.raises(ConfigError) as err:
        config_from_dict(minimal(tmp_path, checkpoint_every="40 steps"))
    assert "train.checkpoint_every: not a duration: '40 steps'" in str(err.value), err.value
    assert "or steps, as an integer: `300` saves every 300 steps, not every 300 seconds" in str(err.value), err.value


def test_each_duration_is_read_in_seconds_on_its_section(tmp_path):
    raw = minimal(tmp_path)
    raw["restart"] = {"backoff_initial": "2s", "backoff_max": 60, "hang_timeout": "2h", "compile_timeout": "45m",
                      "exit_timeout": 1.5}
    raw["sync"], raw["gpu"] = {"every": "1h"}, {"poll_interval": "250ms"}
    cfg = config_from_dict(raw)
    r = cfg.restart
    assert (r.backoff_initial_s, r.backoff_max_s, r.hang_timeout_s, r.compile_timeout_s, r.exit_timeout_s) == \
        (2.0, 60.0, 7200.0, 2700.0, 1.5)
    assert (cfg.sync.every_s, cfg.gpu.poll_interval_s) == (3600.0, 0.25)


def test_an_unknown_key_lists_only_the_keys_a_user_sets(tmp_path):
    """On main `unknown key eval.every (known: probe, probe_staged, ...)`: probe_staged (and init.staged) are set by
    the supervisor for its trainer, never by hand."""
    raw = minimal(tmp_path)
    raw["eval"] = {"colour": 100}  # a name like no key: the known list (user10 #4 guesses at closer ones)
    raw["init"] = {"colour": "x"}
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw)
    text = str(err.value)
    assert "unknown key eval.colour (known: probe, warn_rising" in text, text
    assert "unknown key init.colour (known: from, " in text and "staged" not in text, text


def test_a_field_written_under_a_wrong_name_is_not_judged_by_its_default(tmp_path):
    """Found by a new user: `[model] vocab = 2000` got `unknown key model.vocab: did you mean model.vocab_size?` and,
    beside it, `model.vocab_size = 6400 but the corpus ... was tokenized with a vocabulary of 2000: set
    model.vocab_size = 2000`, the default judged in place of what was written; MiniMind's `epochs = 3` got
    `a budget is required` and an epoch's count beside its `did you mean train.max_epochs?`. The key a hint offers
    is taken as a field whose value cannot be used, as a mistyped one: what derives from it waits."""
    raw = minimal(tmp_path)
    (tmp_path / "prepared" / "meta.json").write_text(json.dumps({"vocab_size": 2000, "splits": {}}))
    raw["model"] = {"vocab": 2000}
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    assert err.value.problems == ["unknown key model.vocab: did you mean model.vocab_size?"], err.value.problems
    raw = minimal(tmp_path)
    raw["train"] = {"epochs": 3}
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    [problem] = err.value.problems
    assert problem.startswith("unknown key train.epochs: did you mean train.max_epochs?"), problem
    raw["train"] = {"bogus_knob": 3}  # no guess: nothing meant, the budget still judged
    with pytest.raises(ConfigError) as err:
        checked_from_dict(raw)
    assert any(p.startswith("a budget is required") for p in err.value.problems), err.value.problems
