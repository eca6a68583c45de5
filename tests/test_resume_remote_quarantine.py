"""A standalone `minilmd train` with a local run.remote looks for its newest checkpoint in the remote root too
(trainer/loop/resume.py checkpoint_roots). Before, a damaged checkpoint found there was quarantined as a scratch one
is (checkpoint_dirs.quarantine: mkdir(exist_ok=True), then a rename by path): a `quarantine` symbolic link planted
in the remote root by another user who can write it was followed, and the run's checkpoint moved into that user's
directory. The remote's own way to set a checkpoint aside is the supervisor's (daemon/jobs/remote_write.py
set_aside, with its checks of whose entries are whose); the trainer now quarantines only in its local root and says
that it passes a damaged remote one by."""
from __future__ import annotations

import os

import pytest

from minilmd import checkpoint as ck
from minilmd import checkpoint_select
from minilmd.names import MODEL_FILE, QUARANTINE
from second_user import USER, second_user, sh_as_user, shared  # noqa: F401 - shared: a fixture
from weights_helpers import CHECKPOINT_MODEL, make_run, save_run


def _expectation() -> ck.Expectation:
    return ck.Expectation(model=dict(CHECKPOINT_MODEL), data_fingerprint="d" * 64, tokenizer_fingerprint="t" * 64)


@pytest.mark.slow  # two checkpoints saved, a second user's shell
def test_a_damaged_remote_checkpoint_is_never_moved_through_a_quarantine_link_of_another_user(tmp_path, shared):
    """The remote root (a shared directory the other user may write) holds a newer damaged checkpoint and her
    `quarantine` link to a directory of hers. The local root's valid older checkpoint is the one resumed from; the
    remote's damaged one stays where it is, said in the log, and nothing of ours lands in her directory."""
    model, opt = make_run(3)
    local = tmp_path / "local"
    good = save_run(local, 3, model, opt)
    remote = shared / "remote"
    bad = save_run(remote, 4)
    remote.chmod(0o777)  # a shared remote: the other user may write in it
    data = bytearray((bad / MODEL_FILE).read_bytes())
    data[200] ^= 0xFF
    (bad / MODEL_FILE).write_bytes(bytes(data))
    sh_as_user(f"mkdir hers && ln -s {shared / 'hers'} {remote / QUARANTINE}", cwd=shared)
    uid, _ = second_user()
    assert os.lstat(remote / QUARANTINE).st_uid == uid

    logs: list[str] = []
    assert checkpoint_select.find_latest([local, remote], _expectation(), log=logs.append) == good
    assert bad.is_dir() and (bad / MODEL_FILE).read_bytes() == bytes(data)  # left where it was
    assert list((shared / "hers").iterdir()) == [], f"moved into {USER}'s directory"
    assert (remote / QUARANTINE).is_symlink()
    assert any(f"checkpoint {bad} is invalid" in line and "not moved" in line for line in logs), logs
