"""A Prometheus textfile another user squatted: the name exists first in a textfile directory others may write
(sticky, like /tmp), as their file or a symlink, and holds their gauges ("minilmd_up 1", "loss 0.01"). The run
never writes through it or replaces it, and says so: an event, state.json's "prometheus", a line in `minilmd
status`, and the run's final state. Two real users: root and nobody (through setpriv).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from minilmd import names
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
    """A textfile directory every user may write, sticky and root's."""
    return shared


@pytest.mark.parametrize("squat", ["file", "symlink"])
def test_a_squatted_textfile_is_never_replaced_and_the_state_says_so(collector, squat):
    uid, _ = second_user()
    path = collector / "s.prom"
    if squat == "file":
        as_nobody(f"printf '{HIS}' > s.prom", collector)
    else:
        as_nobody(f"printf '{HIS}' > his.prom && ln -s his.prom s.prom", collector)
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


def test_a_textfile_the_run_cannot_replace_in_a_sticky_directory_is_said_for_its_user_too(collector):
    (collector / "n.prom").write_text(HIS)  # root's file where nobody's run would write
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
