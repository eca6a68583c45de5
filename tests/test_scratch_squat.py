"""A default scratch root another user made first (`mkdir /dev/shm/minilmd-<her uid>` after a reboot, which anyone
may do) is never used, and ends no run: hostile audit 6, F4. Before, `run --check` and the launch refused it with
exit 2, final for systemd and the tmux launcher: one mkdir stopped her unattended run for good. Now the launch makes
a private root of its own, `<base>/minilmd-<uid>-<8 random>` (mkdtemp: new, 0700), records it in run.dir
(scratch-root.json), and every restart finds it there, checkpoints and all; a reboot that emptied base, and the
same squat of that name too, get a new one. Real users: nobody squats, root's run is the victim (root could write
into nobody's directory, so nothing but the owner check keeps its files out). base is a stand-in for /dev/shm
(scratch_helpers: 1777, MINILMD_SCRATCH_BASE).
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from minilmd.names import CHECKPOINTS, SCRATCH_OWNER, SCRATCH_ROOT_RECORD
from scratch_helpers import AS_NOBODY, NOBODY, shared, text_of, two_users  # noqa: F401 - fixtures
from supervisor_helpers import events

pytestmark = pytest.mark.slow  # real `minilmd run` launches, as a second user too


def squat(path: Path) -> None:
    """nobody makes `path` first, 0700, as any user may in a sticky directory."""
    subprocess.run([*AS_NOBODY, "mkdir", "-m", "700", str(path)], check=True, timeout=30)
    assert path.stat().st_uid == NOBODY.pw_uid


def recorded_root(run_dir: Path) -> Path:
    return Path(json.loads((run_dir / SCRATCH_ROOT_RECORD).read_text())["root"])


def steps_in(scratch: Path) -> list[str]:
    return sorted(p.name for p in (scratch / CHECKPOINTS).iterdir() if p.name.startswith("step-"))


def test_a_squatted_default_scratch_root_is_never_used_and_the_run_goes_on_in_a_private_root_it_keeps(shared):
    base, theirs = shared.base, shared.base / "minilmd-0"
    squat(theirs)
    config = shared.config("root")
    run_dir = config.parent / "same-name" / "run"

    out = shared.users.minilmd("root", "run", "--check", str(config))  # before: exit 2, final
    assert out.returncode == 0, text_of(out)
    assert f"note: the default scratch root is taken: {theirs} belongs to user nobody (uid {NOBODY.pw_uid}); the " \
           f"launch never uses it: it makes a private root {base}/minilmd-0-XXXXXXXX" in text_of(out), text_of(out)

    out = shared.users.minilmd("root", "run", str(config))  # before: exit 2; systemd and tmux never restart it
    assert out.returncode == 0, text_of(out)[-3000:]
    own = recorded_root(run_dir)
    assert own.parent == base and own.name.startswith("minilmd-0-") and own.stat().st_mode & 0o777 == 0o700
    assert f"this run's scratch root is {own}" in text_of(out)
    assert steps_in(own / "same-name") == ["step-00000010", "step-00000020", "step-00000030"][-2:]  # keep_local 2
    assert json.loads((own / "same-name" / SCRATCH_OWNER).read_text())["run_dir"] == str(run_dir)
    assert list(theirs.iterdir()) == []  # nothing of the run in his directory, though root could write there
    start = [e["message"] for e in events(run_dir) if e["event"] == "start"]
    assert f"scratch in the private root {own} (the default: {theirs} belongs to user nobody" in start[0], start
    out = shared.users.minilmd("root", "status", str(run_dir))  # before: no word of it
    assert f"scratch root: the private root {own} (the default: {theirs} belongs to user nobody" in text_of(out), \
        text_of(out)

    # a restart (a longer budget) finds the same private root, and resumes from its checkpoint there
    out = shared.users.minilmd("root", "run", str(config), "--set", "train.max_steps=40")
    assert out.returncode == 0, text_of(out)[-3000:]
    assert recorded_root(run_dir) == own and steps_in(own / "same-name")[-1] == "step-00000040"
    resumed = (run_dir / "logs" / "attempt-0002.log").read_text()
    assert "resuming at step 30" in resumed, resumed[-2000:]  # the fake trainer's word: from its checkpoint there
    assert list(theirs.iterdir()) == []

    # a reboot empties base; he makes the default's name again, and the private root's name too (base is listed
    # by everyone): the next start makes a new private root, never either of his
    shutil.rmtree(own)
    squat(own)
    out = shared.users.minilmd("root", "run", str(config), "--set", "train.max_steps=50")
    assert out.returncode == 0, text_of(out)[-3000:]
    new = recorded_root(run_dir)
    assert new not in (own, theirs) and new.parent == base and steps_in(new / "same-name")[-1] == "step-00000050"
    assert list(theirs.iterdir()) == [] and list(own.iterdir()) == []


def test_the_private_root_is_made_again_under_its_recorded_name_after_a_reboot_and_explicit_scratch_stays_refused(
        shared):
    base, theirs = shared.base, shared.base / "minilmd-0"
    squat(theirs)
    config = shared.config("root")
    run_dir = config.parent / "same-name" / "run"
    assert shared.users.minilmd("root", "run", str(config)).returncode == 0
    own = recorded_root(run_dir)
    shutil.rmtree(own)  # a reboot: base emptied, nobody took the name this time
    out = shared.users.minilmd("root", "run", str(config), "--set", "train.max_steps=40")
    assert out.returncode == 0, text_of(out)[-3000:]
    assert recorded_root(run_dir) == own and own.stat().st_uid == 0 and (own / "same-name" / SCRATCH_OWNER).is_file()
    # a run.scratch set by hand below a directory of his is the user's own choice: still refused, nothing made
    # there (one directly in the default root is that root's: tests/test_scratch_written_default.py)
    subprocess.run([*AS_NOBODY, "mkdir", "-m", "755", str(theirs / "hand")], check=True, timeout=30)
    by_hand = shared.config("root", "h", scratch=str(theirs / "hand" / "h"))
    out = shared.users.minilmd("root", "run", str(by_hand))
    assert out.returncode == 2 and "belongs to user nobody" in text_of(out), text_of(out)
    assert list(theirs.iterdir()) == [theirs / "hand"] and list((theirs / "hand").iterdir()) == []
    assert not (base / "minilmd-0-h").exists()
