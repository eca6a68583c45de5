"""A local remote's root that dirfd's rule refuses, one replaced between syncs, and one named by a file:// URL.

- The fetch for a resume reads a refused root (reads go by path, no write): on main one damaged remote step made it
  set that step aside through the refused root (Remote._root: PlaceRefused, a ValueError the fetch did not catch)
  and the whole fetch failed, retried for ever though an older valid checkpoint was there. Now it is skipped, said,
  and the older one fetched.
- The descriptor of a root replaced (made again, a share remounted) was kept until the Remote closed: one more at
  each replacement, each keeping a lazily unmounted share busy. Now closed at the next sync's start.
- `run --check` passed by every run.remote with "://", though file:///... is a local path the sync writes as one:
  now the remote's own test of a local path decides.
"""
from __future__ import annotations

import os
import shutil
from types import SimpleNamespace

from minilmd.daemon import preflight
from minilmd.daemon.jobs.remote_local import open_remote
from minilmd.daemon.jobs.sync import Syncer
from minilmd.names import LATEST, MANIFEST
from sync_helpers import EXPECTED, save, weights  # noqa: F401 - weights: a fixture
from waiting import without_blocking


def test_a_damaged_step_in_a_refused_root_is_skipped_and_the_older_checkpoint_fetched(tmp_path, weights):
    made, team = tmp_path / "remote", tmp_path / "team"
    save(tmp_path / "old-scratch", 10, weights)
    without_blocking(Syncer(tmp_path / "old-scratch", str(made), EXPECTED).sync_newest)
    open_remote(str(made)).makedirs("step-00000020")
    (made / "step-00000020" / MANIFEST).write_text("[[")
    (made / LATEST).write_text("step-00000020\n")
    team.mkdir()
    team.chmod(0o777)  # not sticky: dirfd's rule refuses a remote below it
    os.rename(made, team / "remote")
    local, logs = tmp_path / "scratch", list[str]()
    fetched = without_blocking(Syncer(local, str(team / "remote"), EXPECTED, log=logs.append).fetch_latest)
    assert fetched == local / "step-00000010", logs
    assert (team / "remote" / "step-00000020" / MANIFEST).read_text() == "[["  # left where it was
    assert any("step-00000020 is invalid" in m and "can be written by other users" in m for m in logs), logs
    assert any(f"{LATEST} not pointed at step-00000010" in m for m in logs), logs


def held_on_removed_directories(root: str) -> int:
    """Descriptors of this process on directories at root's path that were removed since they were opened."""
    fds = "/proc/self/fd"
    return sum(os.readlink(f"{fds}/{fd}") == f"{root} (deleted)" for fd in os.listdir(fds)
               if os.path.islink(f"{fds}/{fd}"))


def test_the_descriptors_of_replaced_roots_are_closed_at_the_next_syncs_start(tmp_path):
    root = tmp_path / "remote"
    remote = open_remote(str(root))
    for _ in range(4):
        remote.makedirs()  # a sync's start: the root opened again when its path leads elsewhere now
        shutil.rmtree(root)  # the root made again (a share remounted: another directory at its path)
        root.mkdir()
    remote.makedirs()
    assert held_on_removed_directories(str(root)) <= 1  # the one replaced at this start, closed at the next
    remote.makedirs()
    assert held_on_removed_directories(str(root)) == 0
    remote.close()


def test_a_file_url_remote_is_checked_as_the_local_path_it_is(tmp_path):
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o777)
    (team / "remote").mkdir()
    (team / "remote" / LATEST).symlink_to("/etc/passwd")
    cfg = SimpleNamespace(run=SimpleNamespace(remote=f"file://{team}/remote"))
    refused = preflight.remote_place_problems(cfg)
    assert len(refused) == 1 and "can be written by other users" in refused[0], refused
    found = preflight.remote_entry_problems(cfg)
    assert len(found) == 1 and f"{LATEST} there is a symbolic link" in found[0], found
    assert preflight.remote_place_problems(SimpleNamespace(run=SimpleNamespace(remote="memory://bucket/x"))) == []


def test_preflight_tells_a_local_remote_by_its_protocol_alone_never_building_a_store():
    """Building a remote store's filesystem may connect to it (fsspec's SFTPFileSystem connects in its __init__):
    preflight's check of run.remote must not wait on a network that is down, nor die of its error."""
    import subprocess
    import sys

    code = ("import sys; from minilmd.daemon.preflight import local_remote_root as r\n"
            "assert r('file:///a/b/') == '/a/b' and r('local:///c') == '/c' and r('/d') == '/d' and r('') is None\n"
            "assert r('memory://x') is None and r('sftp://host/x') is None\n"
            "assert 'fsspec' not in sys.modules, 'a store was built'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
