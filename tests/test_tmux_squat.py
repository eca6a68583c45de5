"""The tmux launcher when another user made its socket directory first.

tmux keeps its sockets in ${TMUX_TMPDIR:-/tmp}/tmux-UID and refuses a directory there that is not its user's alone,
with a bare "directory ... has unsafe permissions". In /tmp (everyone's) another user can make `tmux-UID` of ours
first: before, deploy/minilmd-tmux.sh ended with tmux's words and no hint; now it says whose the directory is and
names TMUX_TMPDIR, exit 2, nothing started. The squat is made by a real second user (nobody) in a sticky shared
directory standing for /tmp.
"""
from __future__ import annotations

import os

import pytest

from deploy_helpers import launcher, launcher_config  # noqa: F401  (launcher: the fixture)
from second_user import sh_as_user, shared  # noqa: F401  (shared: the fixture)

pytestmark = pytest.mark.root


def test_a_squatted_tmux_socket_directory_is_named_with_tmux_tmpdir_and_nothing_starts(launcher, shared):
    sh_as_user(f"mkdir -m 0700 tmux-{os.getuid()}", shared)  # his, where tmux would make ours
    config = launcher_config(launcher.root / "demo.toml", "demo", str(launcher.root / "run"))
    done = launcher("--no-attach", str(config), TMUX_TMPDIR=str(shared))
    assert done.returncode == 2, done
    assert "TMUX_TMPDIR" in done.stderr and "owner nobody" in done.stderr, done.stderr
    assert f"{shared}/tmux-{os.getuid()}" in done.stderr, done.stderr
    assert not launcher.record.exists()  # no supervisor started
    assert sorted(p.name for p in (shared / f"tmux-{os.getuid()}").iterdir()) == []  # his directory untouched



def test_the_way_round_a_squatted_socket_directory_works_where_xdg_runtime_dir_is_unset(launcher, shared):
    """Under su, sudo or cron (no logind session) XDG_RUNTIME_DIR is unset, and the advice
    `TMUX_TMPDIR=$XDG_RUNTIME_DIR` made TMUX_TMPDIR empty: /tmp again, the same refusal (a new user followed it).
    Now the advice is a directory of one's own to make where it is unset, and $XDG_RUNTIME_DIR, named, only where
    it is the user's."""
    sh_as_user(f"mkdir -m 0700 tmux-{os.getuid()}", shared)
    config = launcher_config(launcher.root / "demo.toml", "demo", str(launcher.root / "run"))
    done = launcher("--no-attach", str(config), TMUX_TMPDIR=str(shared), XDG_RUNTIME_DIR="")
    assert done.returncode == 2, done
    assert "$XDG_RUNTIME_DIR" not in done.stderr, done.stderr
    assert "mkdir -p -m 700 ~/.tmux-sockets && TMUX_TMPDIR=~/.tmux-sockets " in done.stderr, done.stderr
    runtime = launcher.root / "xdg"
    runtime.mkdir(mode=0o700)
    done = launcher("--no-attach", str(config), TMUX_TMPDIR=str(shared), XDG_RUNTIME_DIR=str(runtime))
    assert done.returncode == 2, done
    assert "TMUX_TMPDIR=$XDG_RUNTIME_DIR " in done.stderr and f"(here {runtime})" in done.stderr, done.stderr
    assert not launcher.record.exists()  # no supervisor started
