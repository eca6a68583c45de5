"""A pointer's temp file left in a local remote's root is removed only while its name leads to the very file judged
this user's (remote_write.remove_ours with file=True).

On main the temp file was judged (not_ours, by its path) and then unlinked by name: another user's file moved to that
name in between (uid 4242, as on a share where others write into the root) was deleted. Now the identity taken
before the judgement is checked again right before the unlink, and a file swapped in is left, with a reason.

The swap is made at the one moment between the judgement and the unlink, deterministically: right after the look.
"""
from __future__ import annotations

import os

from minilmd.daemon.jobs import remote_write
from minilmd.daemon.jobs.remote_local import open_remote

NAME = ".LATEST.host-1-abcdef12.tmp"
OTHER = 4242


def test_a_temp_file_swapped_after_the_look_is_left(tmp_path, monkeypatch):
    root = tmp_path / "remote"
    remote = open_remote(str(root))
    remote.makedirs()
    (root / NAME).write_text("step-00000005\n")
    judge = remote_write.why_foreign

    def judged_then_swapped(path, *args, **kwargs):
        why = judge(path, *args, **kwargs)
        os.rename(root / NAME, root / "ours-moved-aside")
        (root / NAME).write_text("his\n")
        if os.geteuid() == 0:
            os.chown(root / NAME, OTHER, OTHER)
        return why

    monkeypatch.setattr(remote_write, "why_foreign", judged_then_swapped)
    left = remote.rm(NAME, file=True)
    assert left is not None and "not removed" in left, left
    assert (root / NAME).read_text() == "his\n"
    assert (root / "ours-moved-aside").exists()  # nothing else touched


def test_the_run_s_own_temp_file_is_removed(tmp_path):
    root = tmp_path / "remote"
    remote = open_remote(str(root))
    remote.makedirs()
    (root / NAME).write_text("step-00000005\n")
    assert remote.rm(NAME, file=True) is None
    assert not (root / NAME).exists()


def test_a_link_at_the_temp_name_is_left(tmp_path):
    root = tmp_path / "remote"
    remote = open_remote(str(root))
    remote.makedirs()
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    (root / NAME).symlink_to(target)
    left = remote.rm(NAME, file=True)
    assert left is not None and "link" in left, left
    assert target.read_text() == "keep\n" and (root / NAME).is_symlink()
