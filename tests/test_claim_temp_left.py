"""The claim's temporary file that a supervisor killed while it wrote owner.json left is this run's: removed.

Observed before (reports fault8 F4): the first sync's claim write stalled (FUSE), the supervisor was SIGKILLed, and
the remote kept `.owner.json.<host>-<pid>-<random>.tmp` (the whole claim) for good; each start logged it "a file that
holds no pointer (another file renamed to a pointer's temporary name?): not made by this run, left as it is". It is
named in the run's own naming (RemotePublish.put_new) and sync_leftovers found it (its pid dead), but the removal
proof (remote_made._pointer_problem) took only an empty file or a step name. Now a temporary of the claim that holds
this run's claim, whole or its start past its run_dir field, is this run's and goes; another run's claim there,
or a cut of one too short to name its run whole, is never removed.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from minilmd import names, run_owner, tmpnames
from minilmd.daemon.jobs import remote_claim, remote_made, sync_leftovers
from minilmd.daemon.jobs.remote_local import open_remote

OWNER = names.REMOTE_OWNER

# put_new's writer, SIGKILLed once the claim is written, before its rename: what a supervisor killed there leaves
KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from minilmd import tmpnames
from minilmd.daemon.jobs import remote_claim
from minilmd.daemon.jobs.remote_local import open_remote

store = open_remote(sys.argv[1], tmpnames.pointer_tmp_tag(tmpnames.host_tag(), os.getpid()))
os.fsync = lambda fd: signal.raise_signal(signal.SIGKILL)
remote_claim.ensure(store, remote_claim.Claim(Path(sys.argv[2]), "r"))
"""


def killed_writer(root: Path, run_dir: Path) -> int:
    """The pid of a writer of run_dir's claim on root, killed with SIGKILL while it wrote (reaped: dead)."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(root), str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == -9, out
    return proc.pid


def clean(root: Path, run_dir: Path) -> list[tuple[str, str]]:
    """One sync's clean-up of leftovers on root as run_dir's run: what it left, and why."""
    store = open_remote(str(root), tmpnames.pointer_tmp_tag(tmpnames.host_tag(), os.getpid()))
    left: list[tuple[str, str]] = []
    sync_leftovers.clean_remote_tmp(store, None, lambda n, why: left.append((n, why)), lambda key, msg: None,
                                    lambda msg: None, remote_claim.encoded(remote_claim.Claim(run_dir, "r"), store))
    return left


def test_the_claims_temporary_of_a_writer_killed_mid_write_is_removed_as_this_runs(tmp_path):
    root, run_dir = tmp_path / "remote", tmp_path / "run"
    root.mkdir()
    pid = killed_writer(root, run_dir)
    temps = os.listdir(root)
    assert len(temps) == 1 and temps[0].startswith(f".{OWNER}.{tmpnames.host_tag()}-{pid}-"), temps
    whole = remote_claim.encoded(remote_claim.Claim(run_dir, "r"), open_remote(str(root)))
    assert (root / temps[0]).read_bytes() == whole  # the whole claim, as the crash left it
    cut = root / f".{OWNER}.{tmpnames.host_tag()}-{pid}-0123abcd.tmp"
    cut.write_bytes(whole[:remote_made.run_dir_field_end(whole)])  # a write cut sooner, past its run_dir field
    assert clean(root, run_dir) == []  # before: both left, "a file that holds no pointer ... not made by this run"
    assert os.listdir(root) == []


def test_another_runs_claim_under_the_claims_temporary_name_is_left(tmp_path):
    root, run_dir = tmp_path / "remote", tmp_path / "run"
    root.mkdir()
    pid = killed_writer(root, tmp_path / "other-run")  # another run's writer, on this host, killed
    temps = os.listdir(root)
    assert len(temps) == 1, temps
    left = clean(root, run_dir)
    assert [n for n, _ in left] == temps and "holds no pointer" in left[0][1], left
    assert os.listdir(root) == temps and temps[0].startswith(f".{OWNER}.{tmpnames.host_tag()}-{pid}-")


def test_another_runs_claim_cut_inside_its_run_dir_is_left_though_it_begins_this_runs(tmp_path):
    """Run a1's writer killed as it wrote `"run_dir": ".../a1`: the start of run a10's claim too (review10d F4)."""
    root = tmp_path / "remote"
    root.mkdir()
    other, ours = tmp_path / "runs" / "a1", tmp_path / "runs" / "a10"
    pid = killed_writer(root, other)
    temps = os.listdir(root)
    whole = run_owner.encode(run_owner.record(other, "r"))
    cut = whole[:whole.index(str(other).encode()) + len(str(other))]  # just before its closing quote
    assert run_owner.encode(run_owner.record(ours, "r")).startswith(cut)
    (root / temps[0]).write_bytes(cut)
    left = clean(root, ours)
    assert [n for n, _ in left] == temps, left
    assert os.listdir(root) == temps and temps[0].startswith(f".{OWNER}.{tmpnames.host_tag()}-{pid}-")
