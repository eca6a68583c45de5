"""Root's `minilmd status` (the overview of every user's runs) when one user registers a thousand runs.

Before, each of them was a row: a user who registered 1,000 entries (the registry's per-user cap) filled root's
table, and the other users' runs were lost among his. Now another user with more than GROUP_ABOVE runs is one line
after the table (how many, how many running, the phases), the reader's own runs and the other users' rows stay, and
`--json` still lists every row. The entries are registered by a real second user (nobody) in a shared registry.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.host import registry
from minilmd.daemon.views import overview
from minilmd.fsio import atomic_write_json
from second_user import second_user, shared_dir, user_python

pytestmark = [pytest.mark.root, pytest.mark.slow]

FLOOD = ("import sys\nfrom minilmd.daemon.host import registry\n"
         "for i in range(1000): registry.register(f'flood-{i:04d}', sys.argv[1] + f'/f{i}', 'x.toml')\n")


@pytest.fixture
def place(monkeypatch):
    second_user()
    root = shared_dir()
    try:
        (root / "system").mkdir()
        (root / "system").chmod(0o1777)
        env = {"XDG_STATE_HOME": str(root / "root-state"), names.SYSTEM_REGISTRY_ENV: str(root / "system")}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_thousand_runs_of_one_user_are_one_line_in_roots_overview(place):
    flood = subprocess.run(user_python(FLOOD, str(place)), capture_output=True, text=True, cwd="/", timeout=300,
                           env={**os.environ, "XDG_STATE_HOME": str(place / "nobody-state")})
    assert flood.returncode == 0, flood.stderr
    mine = place / "root-run"
    mine.mkdir()
    atomic_write_json(mine / names.STATE, {**new_state("root-run", mine, "x.toml"), "phase": "training"})
    registry.register("root-run", mine, "x.toml")

    out = io.StringIO()
    assert overview.status_all(out=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) < 10, lines[:30]
    assert lines[0].split()[:2] == ["RUN", "PHASE"] and lines[1].split()[0] == "root-run", lines
    assert "user nobody (uid 65534): 1000 runs in one line (0 running; vanished 1000)" in out.getvalue(), out.getvalue()

    listed = io.StringIO()
    assert overview.status_all(as_json=True, out=listed) == 0
    assert len(json.loads(listed.getvalue())) == 1001  # --json: every row
