"""Every listing of a directory in minilmd, bounded or reviewed: a directory another user, run or machine can write
may hold millions of entries, and os.listdir, os.scandir's whole walk, os.walk, Path.iterdir/glob/rglob or
glob.glob read them all, into memory, over minutes (a remote checkpoint root, /dev/shm's scratch, the system
registry, a corpus or an export's --out in a shared directory).

The audit (tests/listing_audit.py) finds each listing of the audited files (source_tree.audited_files(): the
scripts' too) under any spelling (tests/audit_calls.py: an alias, a star import, posix for os, `ls = os.listdir`,
getattr, os.listdir handed to another function uncalled). minilmd/untrusted.py's `dir_names` is the one bounded
lister (at most MAX_DIR_ENTRIES names read, past that a refusal); `listed` (an OSError for a caller that handles an
unreadable directory: TooManyEntries) and `holds_any` (one entry read) are built on it. Every other listing must be
in REVIEWED below by (module, function, listing) with exactly how many, under the reason its place holds no more
than this run or this user put there: "private" (/proc, the run's 0700 scratch after its checks, a tree this run
made, a package's own directory, a benchmark's or a script's own temporary directory) or "gap" (a place of this
user's own that others cannot fill, not bounded yet: named, so that the next change there knows). A new listing,
one more or one fewer in a function, or a review whose listing is gone, fails this test: list a place others may
fill through untrusted.dir_names/listed/holds_any, or add it here with the reason its place is private; remove what
is gone. tests/test_listing_bound.py shows the bound on real directories of more entries.
"""
from __future__ import annotations

import ast
from collections import Counter

from audit_sites import differences, unexplained
from listing_audit import _Listings, sites

PRIVATE_SCRATCH = ("the run's scratch: 0700, this user's, every directory above it checked, claimed before it is "
                   "listed (minilmd/scratch.py claim, ensure_held)")
BENCH_TMP = "a benchmark's own temporary directory (tempfile's: 0700, a random name made O_EXCL)"
SCRIPT_WORK = ("a device check's or a comparison script's own work directory (--work, or a fresh one of "
               "tempfile's), run by hand by the user on her own machine")

REVIEWED: dict[str, tuple[str, str, dict[tuple[str, str], int]]] = {
    "minilmd/procs.py": ("private", "/proc and /proc/PID/fdinfo: the kernel's, as many entries as processes and "
                         "descriptors there are, nothing another user can add names to", {
        ("Launch.processes", "os.listdir"): 1, ("holds_flock", "os.listdir"): 1}),
    "minilmd/proc_info.py": ("private", "/proc: the kernel's list of processes (a process group's members)",
                             {("group_members", "os.listdir"): 1}),
    "minilmd/dirtree.py": ("private", "dirfd's tree walk through descriptors, depth bounded (MAX_TREE_DEPTH): a "
                           "temporary directory this run made (flushed before it is published: dirpublish.publish, "
                           "fsio.publish_dir, a sync's tree), a directory proven this run's before it is emptied "
                           "(Dir.empty), or prepare's 0700 temporary corpus given its modes before it is published "
                           "(mode_tree)", {
        ("depth_within", "os.scandir"): 1, ("empty_tree", "os.scandir"): 1, ("fsync_tree", "os.scandir"): 1,
        ("mode_tree", "os.scandir"): 1}),
    "minilmd/scratch_end.py": ("private", PRIVATE_SCRATCH + " (the space a staged copy or the whole scratch holds, "
                           "said when it is given back)", {("tree_bytes", "os.walk"): 1}),
    "trainer/loop/entry.py": ("private", "directories `minilmd train` on its own has just made (scratch, its per-user "
                              "root, the compile caches: none was there before its claim, which found no room), "
                              "walked to remove the empty ones again (rmdir, never a file)",
                              {("remove_empty_tree", "os.walk"): 1}),
    "daemon/jobs/scratch_room.py": ("private", PRIVATE_SCRATCH + " (its bytes, counted only when it is the run's: "
                                    "`ours`)", {("_bytes_under", "os.walk"): 1}),
    "daemon/child/compilecache.py": ("private", PRIVATE_SCRATCH + " (the run's compile caches; at most SCAN_LIMIT "
                                     "entries looked at)", {("damaged_kernels", "os.walk"): 1}),
    "daemon/jobs/staging.py": ("private", PRIVATE_SCRATCH + " (a dead supervisor's staging leftovers, after "
                               "ensure_held)", {("stage", ".glob"): 2}),
    "daemon/host/registry.py": ("gap", "the system registry (root's, 1777: every user may add names) read whole on "
                                "purpose, names only, no file looked at past a uid's cap: a cut at a bound would let "
                                "anyone's flood of names hide every other user's runs from them and from root "
                                "(tests/test_registry_flood.py); the per-user registry is the reader's own 0700 "
                                "directory", {("_register_shared", ".glob"): 1, ("_entries_in", "os.scandir"): 1}),
    "daemon/runfiles.py": ("gap", "run.dir/logs: the user's own directory, named in her config and held to the place "
                           "rule (place_rule.run_dir_problem: no other user can add to it or rearrange it); its "
                           "attempt logs are this run's supervisors' (status, which may read another user's run, "
                           "lists them through untrusted.listed)", {("RunFiles.last_attempt", ".iterdir"): 1}),
    "minilmd/corpus/demo_chat.py": ("private", "the chatterbot-corpus package's own data directory in this "
                                    "Python's site-packages (a language's .yml files)", {
        ("dialogs", ".glob"): 1, ("dialogs", ".iterdir"): 1}),
    "minilmd/corpus/bench/append.py": ("private", BENCH_TMP, {("_allocated", "os.walk"): 1}),
    "trainer/bench/checkpoint.py": ("private", BENCH_TMP, {("_dir_size", ".rglob"): 1}),
    "scripts/gpu_check_part.py": ("private", SCRIPT_WORK, {("kill_leftovers", ".glob"): 1}),
    "scripts/lora_size.py": ("private", SCRIPT_WORK + " (a checkpoint it saved itself)", {("<module>", ".iterdir"): 1}),
    "scripts/scratch_start_cost.py": ("private", SCRIPT_WORK + " (a checkpoint it saved itself)",
                                      {("measure", ".iterdir"): 1}),
    "scripts/resume_load_cost.py": ("private", SCRIPT_WORK + " (a checkpoint it saved itself)",
                                    {("measure", ".iterdir"): 1}),
}


def test_every_listing_is_bounded_or_reviewed_and_none_is_new():
    assert not unexplained(REVIEWED), "a review without its place, its reason or its counts"
    problems = differences(sites(), REVIEWED)
    assert not problems, ("directory listings whose count differs from REVIEWED (tests/test_listing_audit.py): list "
                          "a place others may fill through minilmd/untrusted.py's dir_names (listed, holds_any), or "
                          "add it to REVIEWED with the reason its place is private; remove a review whose listing "
                          "is gone:\n  " + "\n  ".join(problems))


PROBE = """\
import os
import os as o
import glob as g
from os import listdir, scandir as sd
from posix import walk
from glob import *
from pathlib import Path
from minilmd.probes import bounded_probe

def f(p, name, fd):
    os.listdir(p)
    o.scandir(p)
    listdir(p)
    sd(fd)
    walk(p)
    os.fwalk(p)
    g.glob(p)
    g.iglob(p)
    iglob(p)
    glob(p)
    bounded_probe(os.listdir, p)
    ls = os.listdir
    ls(p)
    getattr(os, "scandir")(p)
    getattr(os, name)(p)
    os.__dict__["listdir"](p)
    vars(g)["glob"](p)
    Path(p).iterdir()
    p.glob("*")
    Path(p).rglob("*.json")
    p.walk()
    Path.glob(p, "*")
    os.path.join(p, "x")
    os.stat(p)
    getattr(os, "stat")(p)
    "a b".split()

class Store:
    def glob(self, pattern):
        return pattern

    def find(self, pattern):
        return self.glob(pattern)
"""


def test_the_audit_sees_each_listing_by_any_name():
    """Each listing function, under an alias, a from-import, posix for os, a star import, a name it is assigned to,
    getattr (spelled out, or not: counted as one), os.__dict__ and vars(), handed uncalled to another function; each
    Path listing method on any object, Path.glob unbound: all counted. Another os function, getattr of one, and a
    class's own glob method called on self are not."""
    assert _Listings(ast.parse(PROBE)).found == Counter({
        ("f", "os.listdir"): 6, ("f", "os.scandir"): 3, ("f", "os.walk"): 1, ("f", "os.fwalk"): 1,
        ("f", "glob.glob"): 3, ("f", "glob.iglob"): 2, ("f", "os.<getattr>"): 1, ("f", ".iterdir"): 1,
        ("f", ".glob"): 2, ("f", ".rglob"): 1, ("f", ".walk"): 1})


def test_a_review_whose_listing_is_gone_or_one_more_listing_fails():
    found = {"a.py": Counter({("f", "os.listdir"): 2})}
    reviewed = {"a.py": ("private", "a reason long enough", {("f", "os.listdir"): 1, ("g", ".iterdir"): 1})}
    assert differences(found, reviewed) == ["a.py: f: os.listdir x2 (reviewed: 1)",
                                            "a.py: g: .iterdir x0 (reviewed: 1)"]


def test_the_places_others_may_fill_list_only_through_the_bounded_lister():
    """The listings of places another user, run or machine can fill (a remote's checkpoint root, /dev/shm's
    scratch, a corpus's or an export's directory, leftovers beside an output, a sync's new directory, attempt logs
    status reads) hold no listing of their own any more (scratch's one left: the claimed scratch's size)."""
    found = sites()
    for module in ("daemon/jobs/resumefrom.py", "minilmd/scratch.py", "minilmd/scratch_end.py", "minilmd/leftovers.py",
                   "minilmd/corpus/prepare/append.py", "minilmd/corpus/prepare/pipeline.py",
                   "daemon/jobs/remote_made.py", "daemon/jobs/remote_local.py", "daemon/jobs/remote_publish.py",
                   "minilmd/checkpoint_dirs.py", "minilmd/checkpoint_verify.py", "minilmd/batch_stream.py",
                   "daemon/views/status.py", "daemon/views/logs.py", "trainer/model/export_paths.py",
                   "minilmd/shared_place.py", "daemon/demo.py"):
        assert set(found.get(module, {})) <= set(REVIEWED.get(module, ("", "", {}))[2]), module
    assert set(found["minilmd/scratch_end.py"]) == {("tree_bytes", "os.walk")}
