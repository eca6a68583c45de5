"""leftovers.sweep, the one loop of every clean-up of what killed makers left (export, prepare, append, a checkpoint
root): on real directories and real processes, what its options change. Its callers' own tests
(test_export_way_out, test_prepare_leftovers, test_prepare_append_leftovers, test_checkpoint_leftovers) hold the
rule itself: only this user's own leftovers of a gone maker removed, the rest said."""
from __future__ import annotations

import inspect
import os
import socket
from pathlib import Path

import pytest

from minilmd import leftovers
from minilmd.dirfd import Dir
from minilmd.dirtree import OPEN_DIR
from minilmd.proc_info import boot_tag, this_host_tags, this_hosts_remote_maker
from minilmd.tmpnames import (
    export_tmp_maker,
    export_tmp_name,
    host_tag,
    prepare_tmp_maker,
    prepare_tmp_name,
    sync_tmp_name,
)
from proc_fixtures import dead, sleeper  # noqa: F401 - fixtures

WORDS = leftovers.Words(one="a maker", tool="maker", thing="temporary directory", files=False)


def _match(name: str) -> leftovers.Maker | None:
    """`.out.m-HOST-PID-TICKS`, as the makers name theirs (no boot recorded: an older minilmd's)."""
    head, _, rest = name.partition(".out.m-")
    if head or not rest:
        return None
    host, pid, ticks = rest.rsplit("-", 2)
    return host, int(pid), int(ticks), ""


def _opened(path: Path) -> Dir:
    """The directory opened once, as sweep takes it (its callers open it under their own rule)."""
    return Dir(os.open(path, OPEN_DIR), path)


def _name(pid: int, ticks: int) -> str:
    return f".out.m-{socket.gethostname()}-{pid}-{ticks}"


def test_a_gone_makers_leftovers_are_removed_a_live_ones_told_and_others_untouched(tmp_path, dead, sleeper):
    gone = tmp_path / _name(*dead)
    live = tmp_path / _name(*sleeper)
    other = tmp_path / "out.m-not-a-leftover-1-2"
    for d in (gone, live, other):
        (d / "part").mkdir(parents=True)
    said: list[str] = []
    told: list[tuple[Path, int]] = []
    removed = leftovers.sweep(_opened(tmp_path), _match, WORDS, said.append, out=tmp_path / "out",
                              on_running=lambda path, pid: told.append((path, pid)))
    assert removed == [gone] and not os.path.lexists(gone)
    assert told == [(live, sleeper[0])] and (live / "part").is_dir() and (other / "part").is_dir()
    assert said == [f"removed {gone}: the temporary directory of a maker (pid {dead[0]}) killed before it finished"]


def test_its_own_name_is_skipped_and_its_own_pid_is_dead_only_when_asked(tmp_path):
    """A maker's own temporary name (`skip`) is never looked at; one of this process's pid (no start time
    recorded) is a live maker's, unless `mine_is_dead` (a checkpoint root, written by one process at a time)."""
    me = (None, os.getpid(), None, "")
    mine = tmp_path / ".out.m-mine"
    mine.mkdir()
    told: list[Path] = []
    removed = leftovers.sweep(_opened(tmp_path), lambda name: me, WORDS, print, out=tmp_path / "out",
                              on_running=lambda path, pid: told.append(path))
    assert removed == [] and told == [mine] and mine.is_dir()
    assert leftovers.sweep(_opened(tmp_path), lambda name: me, WORDS, print, out=tmp_path / "out",
                           skip=mine.name, mine_is_dead=True) == []
    assert mine.is_dir()
    assert leftovers.sweep(_opened(tmp_path), lambda name: me, WORDS, print, out=tmp_path / "out",
                           mine_is_dead=True) == [mine]
    assert not os.path.lexists(mine)


@pytest.mark.parametrize("only_dirs_and_links", [False, True])
def test_a_file_by_a_makers_name_is_said_unless_only_dirs_and_links_are_looked_at(tmp_path, dead,
                                                                                   only_dirs_and_links):
    """A maker of directories only: a file by its name is not its leftover. Said and left, or (a checkpoint root,
    where fsio's temporary files share the names) passed by unsaid; never removed."""
    f = tmp_path / _name(*dead)
    f.write_bytes(b"somebody's\n")
    said: list[str] = []
    assert leftovers.sweep(_opened(tmp_path), _match, WORDS, said.append, out=tmp_path / "out",
                           only_dirs_and_links=only_dirs_and_links) == []
    assert f.read_bytes() == b"somebody's\n"
    assert said == ([] if only_dirs_and_links else
                    [f"{f}: left as it is: named as a maker's temporary directory but not a directory"])


def test_an_unlistable_parent_finds_nothing(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    with _opened(gone) as parent:
        gone.rmdir()  # removed after it was opened: listing it fails
        assert leftovers.sweep(parent, _match, WORDS, print, out=gone / "out") == []


def test_sweep_takes_the_directory_opened_once_never_a_path():
    """Every clean-up looks and removes through a checked directory's descriptor (house9 item 10): the by-path
    branch (shutil.rmtree of a path) is gone, and the write audit fails on a new one."""
    assert inspect.signature(leftovers.sweep).parameters["parent"].annotation in (Dir, "Dir")
    assert "shutil" not in inspect.getsource(leftovers)


def test_a_makers_host_is_its_host_tag_and_an_older_names_raw_hostname_is_this_hosts_too(tmp_path, dead,
                                                                                          monkeypatch):
    """An export's and a prepare's names record the host as a sync's on the remote do (tmpnames.host_tag): a hostname is
    whatever bytes sethostname took, a `/` too, and the name built from it must stay one name in its directory, and
    no two hosts' tags are the same (`gpu-1` and `gpu_1` once shared `gpu_1`: each judged the other's leftovers by
    its own pids). A leftover under the raw hostname or the older tag (an older minilmd's name) is this host's too;
    another host's is left and said."""
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-node/7")
    host, pid, ticks, boot = leftovers.me()
    assert (host, pid) == ("gpu_2dnode_2f7", os.getpid())
    assert "/" not in export_tmp_name("out", host, pid, ticks, boot)
    assert len({host_tag("gpu-1"), host_tag("gpu_1"), host_tag("gpu.1"), host_tag("gpu1")}) == 4
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-node-7")
    tagged, older, raw, other = (tmp_path / f".out.m-{h}-{dead[0]}-{dead[1]}" for h in (
        "gpu_2dnode_2d7", "gpu_node_7", "gpu-node-7", "gpu-node-8"))
    for d in (tagged, older, raw, other):
        (d / "part").mkdir(parents=True)
    said: list[str] = []
    removed = leftovers.sweep(_opened(tmp_path), _match, WORDS, said.append, out=tmp_path / "out")
    assert sorted(removed) == sorted([tagged, older, raw]) and (other / "part").is_dir()
    [left] = [line for line in said if not line.startswith("removed ")]
    assert left.startswith(f"{other}: left as it is: a maker's temporary directory on host gpu-node-8,"), said


def test_a_remote_name_by_this_hosts_tag_or_its_older_tag_is_this_hosts(monkeypatch):
    """A sync's leftovers on the remote (daemon/jobs/sync_leftovers.py, remote_made.py) are read by this host's tag
    and by the tag an older minilmd wrote for it, so that an upgrade still cleans up a killed sync's half copy; a
    name by another host's tag (once the same older tag as this one's) is not this host's."""
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-1")
    assert this_host_tags() == ("gpu_2d1", "gpu_1")
    for tag in this_host_tags():
        assert this_hosts_remote_maker(sync_tmp_name("step-00000012", tag, 77, 900, "0a1b2c3d")) == (77, 900,
                                                                                                     "0a1b2c3d")
    assert this_hosts_remote_maker(sync_tmp_name("step-00000012", host_tag("gpu_1"), 77, 900, "0a1b2c3d")) is None


def test_a_name_whose_maker_recorded_no_start_time_is_judged_by_its_pid_and_a_live_one_kept(tmp_path, sleeper, dead):
    """leftovers.me records start ticks 0 where this process could not read its own (a /proc read failing: EMFILE);
    the parsers read the 0 back as no start time, so the maker, alive, is found by its pid and its copy kept (a 0
    compared as a start time matched no process: a running export's or prepare's copy was removed as a dead one's)."""
    assert export_tmp_maker("out", export_tmp_name("out", "vm", 41, 0, "")) == ("vm", 41, None, "")
    assert prepare_tmp_maker("out", prepare_tmp_name("out", "vm", 41, 0, "")) == ("vm", 41, None, "")
    live = tmp_path / export_tmp_name("out", host_tag(), sleeper[0], 0, boot_tag())
    gone = tmp_path / export_tmp_name("out", host_tag(), dead[0], 0, boot_tag())
    for d in (live, gone):
        (d / "part").mkdir(parents=True)
    told: list[Path] = []
    removed = leftovers.sweep(_opened(tmp_path), lambda name: export_tmp_maker("out", name), WORDS, print,
                              out=tmp_path / "out", on_running=lambda path, pid: told.append(path))
    assert removed == [gone] and told == [live] and (live / "part").is_dir()
