"""A run config read where others may write: the run's copy (run.toml) that `minilmd status` reads, and another
run's config that init.from names.

Before: status's fitting view parsed run.toml itself with a plain read_text (a FIFO hung `minilmd status`, a link to
/dev/zero read without end, `warn_gap = "x"` was a ValueError traceback); TOML nested too deep was a RecursionError
out of load_config (a supervisor waiting on a predecessor whose config turned into one crashed, exit 1); another
user's run directory named by init.from was refused for its run.toml's owner. Now: one reader (load_config, its
untrusted read), every failure a ConfigError.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from hostile_files_helpers import make_hostile, minilmd
from minilmd import names
from minilmd.config import ConfigError, load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.fsio import atomic_write_json
from minilmd.init_source import InitSourceError, predecessor
from second_user import second_user, shared_dir
from supervisor_helpers import cli, start_supervisor, state, wait_or_kill, write_config
from waiting import wait_until

DEEP = "a = " + "[" * 100_000 + "\n"
"""100 kB of TOML, within MAX_CONFIG_BYTES, nested far past the parser's recursion."""


def test_a_config_nested_too_deep_is_a_config_error(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text(DEEP)
    for untrusted in (False, True):
        with pytest.raises(ConfigError) as e:
            load_config(path, untrusted=untrusted)
        assert e.value.problems == ["not a run config: its TOML is nested too deep"]


def _run_dir_with_epochs(tmp_path: Path, name: str) -> Path:
    """A run directory whose metrics.jsonl shows two finished epochs (so status's fitting view reads run.toml)."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    atomic_write_json(run_dir / names.STATE, new_state(name, run_dir, str(tmp_path / f"{name}.toml")))
    lines = [{"kind": "train", "step": 10 * e + 5, "epoch": e, "loss": 3.0 - e} for e in (0, 1)]
    lines += [{"kind": "eval", "step": 10 * e + 10, "epoch": e, "val_loss": 3.2 - e} for e in (0, 1)]
    (run_dir / names.METRICS).write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "zero", "text_gap", "list_gap", "deep"])
def test_status_of_a_run_whose_config_copy_is_hostile(tmp_path, kind):
    """`minilmd status` as a real process (memory-limited, a timeout): it answers with the epochs and the default
    warnings, never a hang, an unbounded read or a traceback."""
    run_dir = _run_dir_with_epochs(tmp_path, "r")
    copy = run_dir / names.RUN_CONFIG_COPY
    if kind in ("fifo", "zero"):
        make_hostile(copy, kind)
    else:
        copy.write_text({"text_gap": '[eval]\nwarn_gap = "x"\n', "list_gap": "[eval]\nwarn_gap = [1]\n",
                         "deep": DEEP}[kind])
    shown = minilmd("status", str(run_dir), timeout=60)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown
    assert "epoch 1:" in shown.stdout, shown.stdout


def test_the_fitting_view_takes_the_copys_typed_eval_settings(tmp_path):
    """A valid copy's [eval] is what the warnings use (read through load_config, as the other views read it)."""
    from minilmd.daemon.views.fitwatch import warn_settings

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / names.RUN_CONFIG_COPY).write_text(
        f'[run]\nname = "r"\ndir = "{run_dir}"\n[data]\nprepared = "/nowhere"\n[train]\nmax_steps = 10\n'
        "[eval]\nwarn_rising = 5\nwarn_gap = 2\n")
    assert warn_settings(run_dir) == (5, 2.0, 2.0)
    assert warn_settings(run_dir, dpo=True) == (5, 2.0, 2.0)  # set in the config: not DPO_WARN_GAP
    (run_dir / names.RUN_CONFIG_COPY).write_text('[eval]\nwarn_gap = "x"\n')
    assert warn_settings(run_dir, dpo=True) == (3, 0.1, 0.5)  # unreadable: the defaults


@pytest.mark.slow
def test_run_check_of_an_init_from_config_nested_too_deep_is_a_config_error(tmp_path, corpus):
    """init.from naming a run config (another user's, say) of TOML nested too deep: `run --check` exits 2 naming it
    (before: a RecursionError, which the check's probe thread took for a stalled share)."""
    deep = tmp_path / "theirs.toml"
    deep.write_text(DEEP)
    config = write_config(tmp_path, corpus, name="mine", init={"from": str(deep)})
    checked = cli("run", "--check", str(config), timeout=120)
    assert checked.returncode == 2 and "Traceback" not in checked.stderr, checked
    assert "nested too deep" in checked.stdout + checked.stderr, checked


@pytest.mark.slow
def test_a_waiting_stage_whose_predecessor_config_turns_too_deep_fails_with_a_config_error(tmp_path, corpus):
    """The supervisor of a stage waiting in waiting_init reads its predecessor's run.toml at every poll: one turned
    into TOML nested too deep ends the wait with a config error (exit 2, final), not a supervisor traceback (exit 1,
    restarted by systemd into the same crash)."""
    first = write_config(tmp_path, corpus, name="sft", remote=False)
    pred_dir = load_config(first).run_dir
    pred_dir.mkdir(parents=True)
    shutil.copyfile(first, pred_dir / names.RUN_CONFIG_COPY)
    body = new_state("sft", pred_dir, str(first))
    body.update(phase="training", progress={"step": 3}, updated=time.time())
    atomic_write_json(pred_dir / names.STATE, body)
    second = write_config(tmp_path, corpus, name="lora", init={"from": str(pred_dir)})
    proc = start_supervisor(second, tmp_path / "lora.out")
    run_dir = load_config(second).run_dir
    try:
        wait_until(lambda: (state(run_dir).get("init_wait") or {}).get("run") == "sft", timeout=120,
                   what="the wait for the predecessor")
        (pred_dir / names.RUN_CONFIG_COPY).write_text(DEEP)
    finally:
        status = wait_or_kill(proc, timeout=120)
    out = (tmp_path / "lora.out").read_text()
    assert status == 2 and "Traceback" not in out, (status, out)
    assert "nested too deep" in state(run_dir)["last_error"], state(run_dir)


@pytest.mark.root
@pytest.mark.slow
def test_init_from_another_users_run_directory_reads_her_run_toml_not_a_third_uids(tmp_path, corpus):
    """init.from naming another user's run directory (failure-modes.md: "another user's run that init.from names"):
    its run.toml, her supervisor's copy, is read as her file (the owner of her run directory), as its state.json
    is; one owned by a third uid is refused before a byte of it is parsed."""
    uid, gid = second_user()
    shared = shared_dir()
    try:
        hers = write_config(tmp_path, corpus, name="hers", remote=False, run={"dir": str(shared / "hers")})
        her_dir = load_config(hers).run_dir
        her_dir.mkdir()
        shutil.copyfile(hers, her_dir / names.RUN_CONFIG_COPY)
        for path in (her_dir, her_dir / names.RUN_CONFIG_COPY):
            os.chown(path, uid, gid)
        found = predecessor(str(her_dir))
        assert found is not None and found.name == "hers" and found.run_dir == her_dir, found
        os.chown(her_dir / names.RUN_CONFIG_COPY, 54321, 54321)
        with pytest.raises(InitSourceError, match="owned by uid 54321"):
            predecessor(str(her_dir))
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_run_directory_whose_copy_names_another_run_dir_is_refused_not_waited_for_elsewhere(tmp_path, corpus):
    """A run.toml copy written with relative paths by a minilmd before they were recorded absolute (`dir =
    "runs/pre"`) resolves now against the run directory itself: init.from naming that run waited for ever on
    runs/pre/runs/pre/state.json. Its places are not where it sits: refused, saying what to name instead."""
    pre = write_config(tmp_path, corpus, name="pre", remote=False)
    run_dir = load_config(pre).run_dir
    run_dir.mkdir(parents=True)
    text = pre.read_text().replace(f'dir = "{run_dir}"', 'dir = "runs/pre"')
    assert 'dir = "runs/pre"' in text
    (run_dir / names.RUN_CONFIG_COPY).write_text(text)
    with pytest.raises(InitSourceError, match=f"names run.dir {run_dir}/runs/pre, not {run_dir} where it is"):
        predecessor(str(run_dir))
    (run_dir / names.RUN_CONFIG_COPY).write_text(pre.read_text())  # recorded absolute: the run it names
    found = predecessor(str(run_dir))
    assert found is not None and found.run_dir == run_dir
