"""A run's run.toml is read one way, with state.json's owner rule (minilmd/run_config_copy.py run_config_of: the run
directory's owner's copy, or ours). Before (house9 item 1), `stop`'s grace, status's bit-reproducible line and its
overfitting warnings read it as this user's file only: root's `minilmd stop` of a user's orphaned trainer gave it the
default 10 min where her restart.hang_timeout allowed 30, and root's `status` of her run dropped the
bit-reproducible line and warned with the default settings. Six call sites read it three ways with two owner sets;
now an audit holds every read of RUN_CONFIG_COPY to run_config_copy.py.

Another user: as root, the run directory and its copy are given to OTHER_UID (os.chown); as a user, perms.own_uid is
faked to another uid, which makes this process's own files another user's (as tests/test_owner_rule.py does)."""
from __future__ import annotations

import ast
import io
import os
from pathlib import Path

import pytest

import audit_calls
import source_tree
from minilmd import names, perms
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.child.grace import DEFAULT_SAVE_GRACE_S, orphan_save_grace
from minilmd.daemon.views import status as views
from minilmd.daemon.views.fitwatch import warn_settings
from minilmd.fsio import atomic_write_json

OTHER_UID = 4242
THIRD_UID = 54321
HER_GRACE_S = 1800.0


def her_run(tmp_path: Path, monkeypatch) -> Path:
    """A run directory of another user's, her run.toml in it: restart.hang_timeout 30m, her eval warnings, a CPU run."""
    run_dir = tmp_path / "her-run"
    run_dir.mkdir()
    (run_dir / names.RUN_CONFIG_COPY).write_text(
        f'[run]\nname = "her"\ndir = "{run_dir}"\n[data]\nprepared = "/nowhere"\n[train]\nmax_steps = 10\n'
        f'device = "cpu"\n[restart]\nhang_timeout = "30m"\n[eval]\nwarn_rising = 7\nwarn_gap = 2\n', encoding="utf-8")
    st = new_state("her", run_dir, str(run_dir / names.RUN_CONFIG_COPY))
    st.update(child={"pid": 4242, "attempt": 1, "log": "logs/attempt-0001.log"})
    atomic_write_json(run_dir / names.STATE, st)
    if os.geteuid() == 0:
        for path in (run_dir, run_dir / names.RUN_CONFIG_COPY, run_dir / names.STATE):
            os.chown(path, OTHER_UID, OTHER_UID)
    else:
        monkeypatch.setattr(perms, "own_uid", lambda: os.geteuid() + 1)
    return run_dir


def test_roots_stop_gives_her_orphan_her_grace_by_path_and_through_the_judged_directory(tmp_path, monkeypatch):
    run_dir = her_run(tmp_path, monkeypatch)
    assert orphan_save_grace(run_dir) == HER_GRACE_S
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert orphan_save_grace(run_dir, fd) == HER_GRACE_S
    finally:
        os.close(fd)


def test_roots_status_of_her_run_says_her_settings(tmp_path, monkeypatch):
    run_dir = her_run(tmp_path, monkeypatch)
    assert warn_settings(run_dir) == (7, 2.0, 2.0)
    out = io.StringIO()
    assert views.status(run_dir, out=out) == 0
    assert "bit-reproducible: yes, on the CPU" in out.getvalue(), out.getvalue()


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of a third uid needs root to make")
def test_a_run_toml_a_third_user_planted_in_her_run_is_not_read(tmp_path, monkeypatch):
    run_dir = her_run(tmp_path, monkeypatch)
    os.chown(run_dir / names.RUN_CONFIG_COPY, THIRD_UID, THIRD_UID)
    assert orphan_save_grace(run_dir) == DEFAULT_SAVE_GRACE_S
    assert warn_settings(run_dir) == (3, 0.5, 0.5)  # the defaults


READERS = {"load_config", "config_from_bytes", "read_bytes", "read_json", "read_in", "open_regular", "open",
           "read_text", "judge"}
"""Calls that read a file named among their arguments (or, for a Path's read_text/read_bytes, in front of them)."""
STILL_BY_HAND: dict[str, str] = {}
"""Reviewed readers of RUN_CONFIG_COPY outside run_config_copy.py, each with why it is still there."""


def _reads_of_the_copy(tree: ast.Module) -> list[int]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name not in READERS:
            continue
        looked = [*node.args, *(k.value for k in node.keywords)]
        if isinstance(node.func, ast.Attribute):
            looked.append(node.func.value)
        if any(isinstance(n, (ast.Name, ast.Attribute)) and audit_calls.dotted(n, {"RUN_CONFIG_COPY": "RUN"}) ==
               "RUN" or (isinstance(n, ast.Attribute) and n.attr == "RUN_CONFIG_COPY")
               for arg in looked for n in ast.walk(arg)):
            found.append(node.lineno)
    return found


def test_run_toml_is_read_only_by_run_config_of():
    found = [f"{source_tree.relative(path)}:{line}" for path in source_tree.audited_files()
             if path.name != "run_config_copy.py" and source_tree.relative(path) not in STILL_BY_HAND
             for line in _reads_of_the_copy(source_tree.tree(path))]
    assert not found, "a run's run.toml is read by minilmd/run_config_copy.py run_config_of:\n" + "\n".join(found)


def test_the_audit_sees_a_read_of_the_copy():
    tree = ast.parse("load_config(run_dir / names.RUN_CONFIG_COPY, untrusted=True)\n"
                     "read_bytes(RUN_CONFIG_COPY, max_bytes=1, dir_fd=fd)\n"
                     "(run_dir / RUN_CONFIG_COPY).read_text()\n"
                     "x = run_dir / RUN_CONFIG_COPY\n"
                     "print(RUN_CONFIG_COPY)\n")
    assert _reads_of_the_copy(tree) == [1, 2, 3]
