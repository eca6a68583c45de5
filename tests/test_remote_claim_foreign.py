"""Another user's owner.json in a group-shared run.remote (daemon/jobs/remote_claim.py `read`): a group member
could plant one to make the victim's syncs refuse for ever, or to take over whose checkpoints the remote holds, and
its strings (run_dir, host) reached the victim's terminal raw through run_owner.describe (an OSC 52 clipboard
escape printed by `run --check`). It is now read as the remote's other entries are (owner checked before parsing,
remote_write.OWN_UIDS): another user's file is not this run's claim, said as a foreign file naming its uid and never
parsed; every string of a record is shown through untrusted.printable."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from minilmd import names, run_owner
from minilmd.config import load_config
from minilmd.daemon.jobs import remote_claim, remote_consent
from minilmd.daemon.jobs.remote_local import open_remote
from second_user import as_user, group_dir, teammate  # noqa: F401 - the fixture
from supervisor_helpers import cli, write_config

OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"
"""A terminal's clipboard-setting escape (OSC 52): printed raw, it puts `rm -rf ~` on the victim's clipboard."""



def _plant(path: Path, record: dict) -> None:
    """`record` written at `path` as owner.json by the second user himself."""
    done = subprocess.run(as_user(["sh", "-c", 'cat > "$1"', "sh", str(path)]), input=run_owner.encode(record),
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_another_users_owner_json_naming_this_run_is_not_its_claim(teammate, tmp_path):
    (uid, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    claim = remote_claim.Claim(tmp_path / "run", "r")
    _plant(remote / names.REMOTE_OWNER, {**run_owner.record(claim.run_dir, "r"), "host": "h" + OSC52})
    assert os.lstat(remote / names.REMOTE_OWNER).st_uid == uid

    store = open_remote(str(remote))
    said = remote_claim.problem(store, claim)  # before: None, the planted file taken for this run's claim
    assert said is not None and f"owned by uid {uid}" in said and "not this run's claim" in said
    assert "\x1b" not in said and "\x07" not in said
    with pytest.raises(remote_claim.ForeignClaim, match=f"another user's file \\(owned by uid {uid}\\)"):
        remote_claim.read(store)
    with pytest.raises(remote_claim.ClaimRefused):
        remote_claim.ensure(store, claim)  # no sync writes there, nor takes the planted file for its claim
    assert remote_claim.still_ours(store, claim) is not None  # and retention deletes nothing


def test_another_users_owner_json_naming_another_run_puts_no_escape_on_the_terminal(teammate, tmp_path):
    (uid, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    _plant(remote / names.REMOTE_OWNER, {"run_dir": "/srv/x" + OSC52, "run_name": "x", "uid": uid, "host": OSC52})
    said = remote_claim.problem(open_remote(str(remote)), remote_claim.Claim(tmp_path / "run", "r"))
    assert said is not None and f"owned by uid {uid}" in said
    assert "\x1b" not in said and "/srv/x" not in said  # not parsed: nothing of its text shown


def test_a_records_strings_are_shown_escaped():
    """A record this user's own file holds is parsed; its strings still reach the terminal escaped."""
    shown = run_owner.describe({"run_dir": "/srv/x" + OSC52, "run_name": "n" + OSC52, "uid": 0, "host": OSC52})
    assert "\x1b" not in shown and "\x07" not in shown
    assert "/srv/x\\x1b]52;c;cm0gLXJmIH4K\\x07" in shown


def test_run_check_refuses_the_remote_naming_the_planted_files_owner_and_prints_no_escape(teammate, tmp_path, corpus):
    """`minilmd run --check` (the audit's terminal): exit 2, the foreign file and its uid named, no escape printed."""
    (uid, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    config = write_config(tmp_path, corpus, run={"remote": str(remote)})
    _plant(remote / names.REMOTE_OWNER, {"run_dir": "/srv/x" + OSC52, "run_name": "x", "uid": uid, "host": OSC52})
    checked = cli("run", "--check", str(config))
    said = checked.stdout + checked.stderr
    assert checked.returncode == 2, said
    assert f"owned by uid {uid}" in said and "not this run's claim" in said
    assert "\x1b" not in said and "\x07" not in said


@pytest.mark.slow
def test_run_check_says_another_users_owner_json_once(teammate, tmp_path, corpus):
    """The planted file was said twice by `run --check`: as a foreign entry of the remote (preflight's
    remote_entry_problems) and as a foreign claim (remote_claim). One line now: the claim's, which says what the file
    blocks and the two ways on."""
    (uid, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    config = write_config(tmp_path, corpus, run={"remote": str(remote)})
    _plant(remote / names.REMOTE_OWNER, {"run_dir": "/srv/x", "run_name": "x", "uid": uid, "host": "h"})
    checked = cli("run", "--check", str(config))
    said = [line for line in (checked.stdout + checked.stderr).splitlines() if names.REMOTE_OWNER in line]
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert len(said) == 1, said
    assert "not this run's claim" in said[0] and "have its owner remove it" in said[0]


@pytest.mark.slow
def test_claim_remote_never_replaces_another_users_owner_json(teammate, tmp_path, corpus):
    """`minilmd run --claim-remote` (the consent to take the remote of a run moved to another run.dir): another
    user's file is not a claim this user may rewrite; the launch exits 2 before anything is made, the file as it
    was."""
    (uid, gid), where = teammate
    remote = group_dir(where, gid, "remote")
    config = write_config(tmp_path, corpus, run={"remote": str(remote)})
    owner = remote / names.REMOTE_OWNER
    _plant(owner, {"run_dir": "/srv/x", "run_name": "x", "uid": uid, "host": "h"})
    before = (os.lstat(owner).st_ino, owner.read_bytes())
    with pytest.raises(remote_claim.ClaimRefused, match="never replaces nor removes another user's file"):
        remote_consent.take_over(open_remote(str(remote)), remote_claim.Claim(tmp_path / "run", "r"))
    launched = cli("run", "--claim-remote", str(config))
    assert launched.returncode == 2, launched.stdout + launched.stderr
    assert "never replaces nor removes another user's file" in launched.stdout + launched.stderr
    assert (os.lstat(owner).st_ino, owner.read_bytes()) == before and os.lstat(owner).st_uid == uid
    assert not load_config(config).run_dir.exists()  # refused before anything was made
