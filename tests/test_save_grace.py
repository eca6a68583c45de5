"""How long a trainer gets to save after SIGTERM has one home (daemon/child/grace.py): restart.hang_timeout, on every
path that stops a trainer. Before, five paths had five values: `minilmd stop` gave a trainer orphaned by a killed
supervisor 120 s and the orphan hunt at start at most 300 s, where a supervisor's stop gives it restart.hang_timeout
(10 min by default): a save slower than those (a large model, scratch on NFS) was killed and its step lost. The
systemd unit's TimeoutStopSec and the runbook are sized against that grace; Slurm's lead time is said to bound it."""
from __future__ import annotations

import ast
import io
import re
import signal
import sys
import threading
from pathlib import Path

import pytest

from deploy_helpers import parse_unit, systemd_seconds
from minilmd import names, protocol
from minilmd.config import load_config
from minilmd.daemon.child import orphans, trainerwatch
from minilmd.daemon.child.grace import (
    DEFAULT_SAVE_GRACE_S,
    LAST_SYNC_MARGIN_S,
    STOP_WAITS_FOR_STAGING_S,
    SYSTEMD_STOP_TIMEOUT_S,
    orphan_save_grace,
    save_grace,
)
from minilmd.daemon.child.process import launch
from minilmd.daemon.views import stop as views_stop
from waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
SLOW_SAVE = "20m"  # a hang_timeout longer than every value the paths had before (120 s, 300 s, 60 s, 30 s)


def run_with_config(tmp_path: Path, hang_timeout: str | None) -> Path:
    """A run directory with its config copy (as the supervisor leaves it), restart.hang_timeout set or not."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    restart = f'[restart]\nhang_timeout = "{hang_timeout}"\n' if hang_timeout else ""
    (run_dir / names.RUN_CONFIG_COPY).write_text(
        f'[run]\nname = "r"\ndir = "{run_dir}"\n[data]\nprepared = "{tmp_path / "prepared"}"\n'
        f"[train]\nmax_steps = 10\n{restart}", encoding="utf-8")
    return run_dir


def orphaned_trainer(run_dir: Path):
    """A recorded trainer (trainer.json, its launch id in its environment) that exits on SIGTERM at once, found by
    the orphan hunt. A thread reaps it: our child, unreaped, it would count as alive for the whole grace."""
    child = launch([sys.executable, "-c", "import time; time.sleep(120)"], run_dir, 1, devices="")
    threading.Thread(target=child.popen.wait, daemon=True).start()
    wait_until(lambda: child.pid in orphans.find_orphans(run_dir), 60, "the trainer among the run's orphans")
    return child


@pytest.mark.parametrize("hang_timeout, grace", [(SLOW_SAVE, 1200), (None, 600)])
def test_stop_gives_an_orphaned_trainer_the_grace_its_supervisor_would_have(tmp_path, hang_timeout, grace):
    run_dir = run_with_config(tmp_path, hang_timeout)
    child = orphaned_trainer(run_dir)
    try:
        out = io.StringIO()
        views_stop.stop(run_dir, out=out)
        assert f"left by a killed supervisor: SIGTERM (they save first), SIGKILL after {grace}s" in out.getvalue(), \
            out.getvalue()
        assert orphans.find_orphans(run_dir) == []
    finally:
        child.kill_group()


@pytest.mark.slow
@pytest.mark.parametrize("named", ["absolute", "relative"])
def test_stop_timeout_bounds_the_wait_for_an_orphan_and_a_helper_kills_it_at_the_grace(tmp_path, monkeypatch, named):
    """`stop --timeout` ("gives up waiting after that long: exit 1; the stop goes on") waited the whole grace for an
    orphaned trainer (restart.hang_timeout, 10 min by default). Now it waits --timeout, exits 1 saying what goes
    on, and a detached helper SIGKILLs the trainer at the grace: the stop does go on once `stop` has exited."""
    run_dir = run_with_config(tmp_path, "5s")
    ready = tmp_path / "ignores-sigterm"
    child = launch([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                    "open(sys.argv[1], 'w').close(); time.sleep(120)", str(ready)], run_dir, 1, devices="")
    threading.Thread(target=child.popen.wait, daemon=True).start()  # a save that does not end: only SIGKILL ends it
    wait_until(ready.exists, 30, "the trainer to ignore SIGTERM")
    wait_until(lambda: child.pid in orphans.find_orphans(run_dir), 60, "the trainer among the run's orphans")
    try:
        out = io.StringIO()
        monkeypatch.chdir(tmp_path)  # `minilmd stop run` from beside it: the helper runs in "/"
        named_as = run_dir if named == "absolute" else Path(run_dir.name)
        assert views_stop.stop(named_as, timeout=1, out=out) == protocol.STOP_FAILED, out.getvalue()
        said = out.getvalue()
        assert f"[{child.pid}] still saving after 1s: not waited for any longer (exit 1); the stop goes on" in said
        assert "SIGKILLs them 5s after the SIGTERM if they have not exited by then" in said, said
        assert child.popen.poll() is None  # stop returned before the grace; the helper kills it there
        wait_until(lambda: child.popen.poll() is not None, 60, "the helper to SIGKILL the trainer at the grace")
        assert child.popen.returncode == -signal.SIGKILL
    finally:
        child.kill_group()


def test_an_unreadable_config_copy_gives_the_default_grace(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / names.RUN_CONFIG_COPY).write_text("[restart\n", encoding="utf-8")
    assert orphan_save_grace(run_dir) == DEFAULT_SAVE_GRACE_S == 600


def test_the_orphan_hunt_at_start_gives_the_same_grace_as_a_stop(tmp_path):
    run_dir = run_with_config(tmp_path, SLOW_SAVE)
    cfg = load_config(run_dir / names.RUN_CONFIG_COPY)
    child = orphaned_trainer(run_dir)
    said: list[str] = []
    try:
        trainerwatch.kill_orphans(cfg, run_dir, lambda kind, message, **_: said.append(message), lambda: None)
    finally:
        child.kill_group()
    assert save_grace(cfg) == 1200
    assert any("SIGTERM, SIGKILL after 1200s" in line for line in said), said  # before: at most 300 s


def _grace_args(tree: ast.AST):
    """(line, grace expression) of each call that SIGTERMs a trainer and SIGKILLs it after a grace."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name in ("kill_group", "terminate_orphans"):
                for kw in node.keywords:
                    if kw.arg == "grace":
                        yield node.lineno, kw.value


def _from_grace_module(expr: ast.expr, assigned: dict[str, ast.expr]) -> bool:
    if isinstance(expr, ast.Name) and expr.id in assigned:
        expr = assigned[expr.id]
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id.endswith("save_grace")


def test_every_grace_before_sigkill_comes_from_the_grace_module():
    """No path keeps a number of its own: every kill_group(grace=...) and terminate_orphans(grace=...) in daemon/
    is save_grace(...) or orphan_save_grace(...), directly or through a name assigned from one."""
    strays = []
    for path in sorted((REPO / "daemon").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assigned = {t.id: node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
        strays += [f"{path.relative_to(REPO)}:{line}: grace={ast.unparse(expr)}" for line, expr in _grace_args(tree)
                   if not _from_grace_module(expr, assigned)]
    assert not strays, "a grace not from daemon/child/grace.py:\n" + "\n".join(strays)


def test_the_unit_allows_the_default_grace_and_the_last_sync_and_the_runbook_says_so():
    unit = parse_unit((REPO / "deploy" / "minilmd@.service").read_text(encoding="utf-8"))
    stop_s = systemd_seconds(unit["Service"]["TimeoutStopSec"][0])
    assert stop_s == SYSTEMD_STOP_TIMEOUT_S  # the figure `run --check` compares restart.hang_timeout with
    # the trainer's save, then a staging copy still running, then at least a minute for the last sync
    assert stop_s >= DEFAULT_SAVE_GRACE_S + STOP_WAITS_FOR_STAGING_S + LAST_SYNC_MARGIN_S >= \
        DEFAULT_SAVE_GRACE_S + STOP_WAITS_FOR_STAGING_S + 60, stop_s
    ops = " ".join((REPO / "docs" / "operations.md").read_text(encoding="utf-8").split())
    said = re.search(r"\(the unit allows (\d+) minutes: the trainer's save grace, `restart\.hang_timeout`, (\d+) min "
                     r"by default, then the last sync\)", ops)
    assert said, "docs/operations.md: the unit's stop timeout and what it covers"
    assert (int(said.group(1)) * 60, int(said.group(2)) * 60) == (stop_s, DEFAULT_SAVE_GRACE_S)
    readme = (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    assert f"up to {stop_s / 60:.0f} minutes are allowed" in " ".join(readme.split())


def test_slurms_lead_time_is_what_the_runbook_says_bounds_the_save():
    leads = {int(m) for script in ("minilmd.sbatch", "minilmd-multinode.sbatch")
             for m in re.findall(r"^#SBATCH --signal=B:USR1@(\d+)$",
                                 (REPO / "deploy" / "slurm" / script).read_text(encoding="utf-8"), re.M)}
    assert len(leads) == 1, leads
    lead = leads.pop()
    ops = " ".join((REPO / "docs" / "operations.md").read_text(encoding="utf-8").split())
    from minilmd.daemon.slurm.jobend import REQUEUE_MARGIN_S

    said = (f"Here the time limit, not `restart.hang_timeout`, bounds the trainer's save and the last sync: {lead} s "
            f"less the {REQUEUE_MARGIN_S:g} s kept for the requeue (below), then Slurm's SIGTERM and its `KillWait`")
    assert said in ops


@pytest.mark.slow
def test_check_notes_a_hang_timeout_the_systemd_unit_does_not_allow_a_stop(tmp_path, corpus):
    """A restart.hang_timeout that, with a staging copy's wait and the last sync, outlasts the unit's TimeoutStopSec:
    under systemd the stop ends in systemd's SIGKILL before the trainer's save. `run --check` said nothing."""
    from supervisor_helpers import cli, write_config

    slow = write_config(tmp_path, corpus, name="slow", restart={"hang_timeout": SLOW_SAVE})
    shown = cli("run", "--check", str(slow))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert (f"note: restart.hang_timeout = {SLOW_SAVE}: a stop may take 22 min (the trainer's save, 1200s, then a "
            "staging copy and the last sync), more than the systemd unit allows (deploy/minilmd@.service "
            "TimeoutStopSec=15min): under systemd set TimeoutStopSec=22min or more") in shown.stdout, shown.stdout
    default = write_config(tmp_path, corpus, name="default", restart={"hang_timeout": "10m"})
    shown = cli("run", "--check", str(default))
    assert shown.returncode == 0 and "TimeoutStopSec" not in shown.stdout, shown.stdout + shown.stderr
