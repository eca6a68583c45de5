"""The run `minilmd status`, `logs` and `stop` are given (daemon/views/runarg.py): a run directory or the config
file naming one (its run.dir resolved as `minilmd run` does, relative to the config's directory), and another
user's run directory this user may not look into (the default run.share "private") answered by its owner's name,
exit 1, as `stop` answers any other user's run."""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd.daemon.views import runarg
from minilmd.daemon.views import status as views
from minilmd.daemon.views import stop as views_stop
from second_user import shared_dir, user_python
from supervisor_helpers import ended_run

CONFIG = '[run]\nname = "tiny"\ndir = "runs/tiny"\n\n[data]\nprepared = "corpus"\n\n[train]\nmax_steps = 30\n'


def test_status_logs_and_stop_accept_the_config_file_and_find_its_run_dir_beside_it(tmp_path, monkeypatch):
    run_dir = ended_run(tmp_path / "cfg" / "runs" / "tiny")
    config = tmp_path / "cfg" / "tiny.toml"
    config.write_text(CONFIG)
    monkeypatch.chdir(tmp_path)  # run.dir is relative to the config's directory, not to the shell's
    out = io.StringIO()
    assert views.status(config, out=out) == 0
    assert f"run tiny ({run_dir})" in out.getvalue() and "not running (ended" in out.getvalue(), out.getvalue()
    out = io.StringIO()
    assert views.logs(config, out=out) == 0
    assert "the supervisor's line" in out.getvalue()
    out = io.StringIO()
    assert views_stop.stop(config, out=out) == 0
    assert "not running (ended" in out.getvalue() and "the run finished" in out.getvalue(), out.getvalue()


def test_a_file_that_is_no_run_config_is_not_a_run(tmp_path, capsys):
    bad = tmp_path / "notes.toml"
    bad.write_text('[run]\nname = "x"\n')  # no budget, no run.dir
    assert views.status(bad, out=io.StringIO()) == 2
    said = capsys.readouterr().err
    assert "not a run directory, and not a run config that names one" in said and "budget" in said, said
    assert views_stop.stop(bad, out=io.StringIO()) == 2 and views.logs(bad, out=io.StringIO()) == 2


def test_the_config_of_a_run_never_started_is_said_to_be_one_with_how_to_start_it(tmp_path, capsys):
    """Before: `/path/runs/tiny: no such directory`, as if the config were wrong. The exit status stays 2 (docs/
    operations.md: not a run directory); `logs -f` still waits for that run.dir (the tmux launcher's)."""
    config = tmp_path / "cfg" / "tiny.toml"
    config.parent.mkdir()
    config.write_text(CONFIG)
    said = (f"run tiny has not started yet (no run.dir at {tmp_path / 'cfg' / 'runs' / 'tiny'}): `minilmd run "
            f"{config}` starts it")
    for view in (views.status, views_stop.stop, views.logs):
        assert view(config, out=io.StringIO()) == 2
        err = capsys.readouterr().err
        assert said in err and "no such directory" not in err, err
        # stop only: a start under way has no run.dir to leave its request in yet (found by a new user)
        assert ("`minilmd stop` again then stops that start" in err) == (view is views_stop.stop), err
    with pytest.raises(runarg.RunProblem) as e:
        runarg.open_run(config, "logs")
    assert e.value.run_dir == tmp_path / "cfg" / "runs" / "tiny"  # what `logs -f` waits for


@pytest.mark.root
def test_another_users_private_run_is_refused_naming_its_owner_exit_1():
    """A run directory of root's, 0700 (run.share "private"), as user nobody sees it: each command names its owner
    and exits 1 (stop: nothing signalled), never `cannot be read ... exit 2` as if it were no run."""
    place = shared_dir()
    try:
        run_dir = ended_run(place / "runs" / "tiny")
        run_dir.chmod(0o700)
        (place / "runs").chmod(0o755)
        code = ("import sys\nfrom minilmd.daemon.views import status, stop\n"
                "command, run_dir = sys.argv[1], sys.argv[2]\n"
                "sys.exit(stop.stop(run_dir) if command == 'stop' else getattr(status, command)(run_dir))\n")
        for command in ("status", "logs", "stop"):
            done = subprocess.run(user_python(code, command, str(run_dir)), capture_output=True, text=True,
                                  timeout=60, cwd="/")
            said = done.stdout + done.stderr
            assert done.returncode == 1, (command, said)
            assert "a directory of user root (uid 0), not yours, user nobody (uid " in said, said
            assert "Permission denied" in said, said
            assert ("nothing signalled" in said) == (command == "stop"), said
    finally:
        shutil.rmtree(place)


@pytest.mark.root
def test_another_users_link_into_a_directory_the_caller_may_not_look_into_is_refused_saying_so():
    """Review 7 #6: as nobody, a link of another uid's into that uid's 0700 directory was refused with "leads to the
    run directory X (which cannot be looked at); whoever owns a link or config chooses which run it leads to",
    blaming the link. Now what is true: X cannot be looked at (Permission denied), so whose run it is cannot be
    told. Still refused, exit 2: the link is not followed."""
    other = 64123  # no passwd entry needed to own a file
    place = shared_dir()
    try:
        closed = place / "closed"
        run_dir = ended_run(closed / "run")
        for path in (closed, *closed.rglob("*")):
            os.lchown(path, other, other)
        closed.chmod(0o700)
        link = place / "current"
        link.symlink_to(run_dir)
        os.lchown(link, other, other)
        code = "import sys\nfrom minilmd.daemon.views import status\nsys.exit(status.status(sys.argv[1]))\n"
        done = subprocess.run(user_python(code, str(link)), capture_output=True, text=True, timeout=60, cwd="/")
        said = done.stdout + done.stderr
        assert done.returncode == 2, said
        assert f"{link} is a symbolic link of uid {other}, neither yours, user nobody (uid " in said, said
        assert (f"nor root's: it leads to {run_dir}, which cannot be looked at (Permission denied); whose run is "
                f"there cannot be told") in said, said
        assert "refused: nothing signalled, nothing written" in said, said
    finally:
        shutil.rmtree(place)


def test_the_cli_help_of_each_view_says_a_config_file_is_taken_too():
    for command in ("status", "logs", "stop"):
        done = subprocess.run([sys.executable, "-m", "minilmd.cli", command, "--help"], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
        assert "or the run config file that names it" in done.stdout, (command, done.stdout)


VIEWS_TABLE = re.compile(r"`minilmd status RUN_DIR` and `minilmd logs RUN_DIR`[^\n]*\n\n((?:\|[^\n]*\n)+)")


def test_the_exit_statuses_of_status_and_logs_are_documented_as_the_code_has_them():
    text = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text(encoding="utf-8")
    table = VIEWS_TABLE.search(text)
    assert table, "docs/operations.md: no exit table of `minilmd status` and `minilmd logs`"
    rows = {int(s) for s in re.findall(r"^\| (\d+) \|", table.group(1), re.M)}
    assert rows == {0, runarg.CANNOT_READ, runarg.NOT_A_RUN}, rows


def test_a_running_runs_config_with_a_typo_still_names_its_run_and_warns_what_the_next_launch_refuses(
        tmp_path, capsys):
    """A user editing the config of a running run for its next restart (a typo in another key) may still `stop`,
    `status` or `logs` it: run.dir is all these commands need; stderr lists what the next launch will refuse."""
    run_dir = ended_run(tmp_path / "cfg" / "runs" / "tiny")
    config = tmp_path / "cfg" / "tiny.toml"
    config.write_text(CONFIG + "eval_evry = 5\n")
    for command in (views.status, views.logs, views_stop.stop):
        out = io.StringIO()
        assert command(config, out=out) == 0, capsys.readouterr().err
        assert str(run_dir) in out.getvalue() or "the supervisor's line" in out.getvalue(), out.getvalue()
        said = capsys.readouterr().err
        assert "the next launch of this config will refuse it" in said and "unknown key train.eval_evry" in said, said
    shutil.rmtree(run_dir)  # no run there: the config's problems are why it names none
    assert views.status(config, out=io.StringIO()) == 2
    said = capsys.readouterr().err
    assert "not a run config that names one: unknown key train.eval_evry" in said, said


def test_a_missing_config_file_is_no_such_file_and_a_negative_line_count_is_refused(tmp_path):
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "status", str(tmp_path / "nope.toml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "nope.toml: no such file or directory" in done.stderr, done.stderr
    ended_run(tmp_path / "run")
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "logs", str(tmp_path / "run"), "-n", "-1"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 2 and "--lines" in done.stderr, (done.stdout, done.stderr)
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "logs", str(tmp_path / "run"), "-n", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
