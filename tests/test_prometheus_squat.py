"""A Prometheus textfile another user squatted: the name exists first in the textfile directory, as their file or a
symlink, and holds their gauges ("minilmd_up 1", "loss 0.01"): made while the directory was open to them, before
its owner closed it (chmod go-w, what the directory's rule asks), or an admin's. The run never writes through it
or replaces it, and says so: an event, state.json's "prometheus", a line in `minilmd status`, and the run's final
state. A directory others may write now, sticky or not, is refused itself (path_checks.textfile_dir_problem): they
could squat the name again at any time. Two real users: root and nobody (through setpriv).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import ConfigError
from minilmd.daemon import preflight
from minilmd.daemon.base.runstate import RunState, new_state
from minilmd.daemon.host import prometheus
from minilmd.daemon.views.status import summary_lines
from second_user import (
    second_user,
    shared,  # noqa: F401 - a fixture
    user_python,
)
from second_user import sh_as_user as as_nobody
from supervisor_helpers import run_supervisor, write_config

pytestmark = pytest.mark.root

HIS = 'minilmd_up{run="s"} 1\nminilmd_loss{run="s"} 0.01\n'


@pytest.fixture
def collector(shared):
    """The run's user's (root's) textfile directory, every user's to write (1777) until `closed`."""
    made = shared / "prom"
    made.mkdir()
    made.chmod(0o1777)
    return made


def closed(collector: Path) -> Path:
    """The chmod go-w the directory's rule asks for, once his file is there."""
    collector.chmod(0o755)
    return collector


def test_a_textfile_directory_others_may_write_is_refused_by_check_and_never_written(collector, tmp_path, corpus):
    """A 1777 textfile directory (sticky, like /tmp) let another user make the file's name first, or report gauges
    of the run's name in a file of his beside it, which the collector exports all the same. Before, `run --check`
    passed it (the GPU lock directory's rule: a sticky directory of root's or ours is fine) and the supervisor wrote
    there. Now refused, as run.dir itself is, by the check and by the writer: nothing written."""
    as_nobody(f"printf '{HIS}' > his.prom", collector)
    path = collector / "s.prom"
    config = write_config(tmp_path, corpus, remote=False, log={"prometheus_textfile": str(path)})
    said = (f"log.prometheus_textfile {collector}: the directory {collector} can be written by other users (mode "
            f"1777: sticky, which keeps them from removing or renaming its files, not from making them first)")
    with pytest.raises(ConfigError) as check:  # `run --check`, and the launch: exit 2
        preflight.check(str(config))
    assert said in str(check.value) and f"chmod go-w {collector} (it is yours)" in str(check.value), check.value
    state = RunState(tmp_path / "state.json", new_state("s", tmp_path / "run", "x.toml"))
    writer = prometheus.Textfile(str(path), state, lambda kind, message: None)
    writer.tick("training", force=True)
    writer.close("done")
    assert not path.exists() and said in state.data["prometheus"]["problem"], state.data["prometheus"]
    closed(collector)
    assert prometheus.place_problem(path) is None
    writer.close("done")
    assert "minilmd_up" in path.read_text() and state.data["prometheus"]["problem"] is None


def test_a_sticky_textfile_directory_of_roots_others_may_write_is_refused_for_another_user(collector):
    """/tmp-like, root's 1777, for a user who is not root: refused too, the advice another directory."""
    code = ("import sys\nfrom minilmd.path_checks import textfile_dir_problem\n"
            "print(textfile_dir_problem(sys.argv[1]))\n")
    done = subprocess.run(user_python(code, str(collector)), capture_output=True, text=True, cwd="/", timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"the directory {collector} can be written by other users (mode 1777: sticky" in done.stdout, done.stdout
    assert "chmod" not in done.stdout and "choose a directory only you (and root) can write" in done.stdout


@pytest.mark.parametrize("squat", ["file", "symlink"])
def test_a_squatted_textfile_is_never_replaced_and_the_state_says_so(collector, squat):
    uid, _ = second_user()
    path = collector / "s.prom"
    if squat == "file":
        as_nobody(f"printf '{HIS}' > s.prom", collector)
    else:
        as_nobody(f"printf '{HIS}' > his.prom && ln -s his.prom s.prom", collector)
    closed(collector)
    said = []
    state = RunState(collector / "state.json", new_state("s", collector / "run", "x.toml"))
    writer = prometheus.Textfile(str(path), state, lambda kind, message: said.append((kind, message)))
    for phase in ("staging", "training", "training"):
        writer.tick(phase, force=True)
    writer.close("done")
    assert path.lstat().st_uid == uid and path.read_text() == HIS  # his gauges, untouched: never ours to replace
    problem = state.data["prometheus"]["problem"]
    why = "belongs to user nobody" if squat == "file" else "is a symbolic link"
    assert why in problem and state.data["prometheus"]["path"] == str(path), state.data["prometheus"]
    assert len(said) == 1 and said[0][0] == "prometheus" and why in said[0][1], said  # said once
    shown = "\n".join(summary_lines(state, alive=False))
    assert f"prometheus textfile {path} {problem}" in shown, shown


def test_a_textfile_the_run_cannot_replace_is_said_for_its_user_too(collector):
    (collector / "n.prom").write_text(HIS)  # root's file where nobody's run would write
    closed(collector)  # root's, no one else's to write: the directory's rule passes it
    code = ("import json, sys\nfrom minilmd.daemon.host import prometheus\n"
            "from pathlib import Path\nfrom minilmd.daemon.base.runstate import RunState, new_state\n"
            "state = RunState(Path(sys.argv[1]) / 'n-state.json', new_state('n', sys.argv[1], 'x.toml'))\n"
            "writer = prometheus.Textfile(sys.argv[1] + '/n.prom', state, lambda kind, message: None)\n"
            "writer.tick('training', force=True)\n"
            "print(json.dumps(state.data['prometheus']))\n")
    done = subprocess.run(user_python(code, str(collector)), capture_output=True, text=True, cwd="/", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "belongs to user root" in json.loads(done.stdout)["problem"]
    assert (collector / "n.prom").read_text() == HIS


def test_a_writable_textfile_has_no_problem_and_recovers_once_the_squatter_is_gone(tmp_path):
    said = []
    state = RunState(tmp_path / "state.json", new_state("s", tmp_path, "x.toml"))
    path = tmp_path / "s.prom"
    path.symlink_to(tmp_path / "elsewhere.prom")
    writer = prometheus.Textfile(str(path), state, lambda kind, message: said.append(message))
    writer.tick("training", force=True)
    assert state.data["prometheus"]["problem"] and not (tmp_path / "elsewhere.prom").exists()
    path.unlink()
    writer.tick("training", force=True)
    assert state.data["prometheus"] == {"path": str(path), "problem": None, "since": None}
    assert "minilmd_up" in path.read_text() and said[-1].endswith("is written again")


@pytest.mark.slow
def test_the_runs_final_state_and_status_say_the_textfile_is_not_its_own(collector, tmp_path, corpus):
    as_nobody(f"printf '{HIS}' > s.prom", collector)
    closed(collector)
    config = write_config(tmp_path, corpus, remote=False, train={"device": "cpu", "max_steps": 10},
                          log={"prometheus_textfile": str(collector / "s.prom")})
    assert run_supervisor(config, tmp_path) == 0
    run_dir = tmp_path / "s" / "run"
    final = json.loads((run_dir / names.STATE).read_text())
    assert final["outcome"]["exit"] == 0 and "belongs to user nobody" in final["prometheus"]["problem"]
    assert (collector / "s.prom").read_text() == HIS
    events = [json.loads(line) for line in (run_dir / names.EVENTS).read_text().splitlines()]
    assert [e for e in events if e.get("event") == "prometheus"], events
    shown = subprocess.run([sys.executable, "-m", "minilmd.cli", "status", str(run_dir)], capture_output=True,
                           text=True, timeout=60, env={**os.environ})
    assert f"prometheus textfile {collector / 's.prom'} belongs to user nobody" in shown.stdout, shown.stdout
