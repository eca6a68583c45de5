"""Every call in minilmd that creates, renames, chmods or deletes by path, reviewed (issue 40: each surface got its
own guard, so each new surface started unguarded).

The audit walks the source of minilmd/, daemon/ and trainer/ (tests/source_tree.py's one parse) and lists each such
call, under whatever name its module or function was imported (`import shutil as sh`, `from os import rename`):
os.rename, replace, chmod, unlink, remove, rmdir, mkdir, makedirs, link, symlink, mkfifo, truncate, and os.open with
O_CREAT, O_WRONLY, O_RDWR, O_TRUNC or O_APPEND (in its flags, a module constant, or flags it cannot read);
shutil.rmtree, move, copy*; tempfile's mkstemp,
mkdtemp, NamedTemporaryFile, TemporaryDirectory, TemporaryFile; numpy's save, savez, savez_compressed, savetxt and
an array's tofile; safetensors' save_file; torch.save; open() and Path.open() for writing; Path.write_text/
write_bytes/mkdir/unlink/rmdir/rename/replace/chmod/touch/symlink_to. A call given a directory descriptor (dir_fd=,
src_dir_fd=, not None) is not by path, and is the rule's own only in minilmd/dirfd.py (exempt: the one way to write
into a place others can change), dirtree.py and place_rule.py: anywhere else it is listed as "CALL@dir_fd" and
reviewed. Any spelling counts (tests/audit_calls.py): a star import, posix for os, getattr(os, "unlink"), `o = open`,
os.open's flags as a number; codecs/gzip/bz2/lzma/tarfile.open and zipfile.ZipFile for writing, np.memmap (its
default mode writes), shutil.chown/copymode/copystat, os.mknod/utime, a mode in a variable (open()'s counted; a
method's open, Path.open or fs.open, reads a name the module binds to literals alone and counts any other), flags in
a variable, and rm, mv, cp, ln, chmod... run as a command (FILE_COMMANDS); fsspec's writing methods (pipe_file, mv,
put_file, rm_file...; rm, makedirs, put on a filesystem named fs: FSSPEC_CALLS) and TensorBoard's SummaryWriter.
The files read are source_tree.audited_files(): the scripts' too.
Every other site must be in REVIEWED below, by (module, function, call) with exactly how many, under the reason its
place is safe: "private" (a place of this user's alone: the run's 0700 scratch, a 0700 temporary directory of
dirfd's reached by its descriptor, tempfile's own O_EXCL names, a place checked by dirfd's rule before), or "gap" (a
place others may write that does not go through dirfd yet: named, so that the next change there knows;
docs/failure-modes.md "Shared places" lists them). A new site anywhere, one more or one fewer of a kind in a
function, or a review whose call is gone, fails this test: put a new one through minilmd/dirfd.py's `Dir`, or add
it here with the reason its place is private; remove what is gone.
"""
from __future__ import annotations

import ast
from collections import Counter

from audit_sites import differences, unexplained
from write_audit import _Sites, sites

PRIVATE_SCRATCH = "the run's scratch: 0700, this user's, every directory above it checked (minilmd/scratch.py)"
PRIVATE_TMP = ("inside a 0700 temporary directory of dirfd's (Dir.make_temp), reached as /proc/self/fd/N: no one "
               "else can write there, whatever its name leads to")
RUN_DIR = ("run.dir and what it holds (state, logs, metrics, the lock): the user's own directory, named in her "
           "config, written by name (not through dirfd); held to the place rule at run --check, the launch and "
           "minilmd train (place_rule.run_dir_problem; made and resolved in one walk: place_rule.settle_run_dir), so "
           "no other user can rearrange it or a directory above it")
REMOTE = ("a store's objects through fsspec (Remote), never a local path: urls.open_fs refuses an fsspec chain over "
          "one (urls.chain_over_local) and remote_local.open_remote makes every local place (a path, file://, "
          "local://: urls.is_local_fs) a LocalRemote, made by the place rule's walk (LocalRemote._make_root: "
          "place_rule.walk_to) and written at its checked descriptor; an object store has no links to follow and no "
          "renames, so a PUT (pipe_file, an fs.open for writing), makedirs or rm reaches only the object it names")
DEMO_DIR = ("the demo's own directory, judged by run.dir's place rule before anything is made in it (daemon/demo.py "
            "fresh_start: it and every directory above root's or this user's, none another user can rearrange, a "
            "link on the way only root's or ours); an earlier one removed only when it holds the demo's marker, "
            "through the descriptor of the directory holding it")
OWN_OUTPUT = ("an output a library call is given by name (train_tokenizer's `out`, the chat benchmark corpora's, "
              "which benchmarks and tests write into their own temporary directories): written by name as any "
              "tool's output; not hardened for a directory others write (the commands' outputs are: tokenizer train's "
              "and plot's --out, demo-corpus's OUT through fsio.write_out_text/write_out_bytes/open_out_dir)")

SCRIPT_WORK = ("a device check's or a comparison script's own work directory (--work, or a fresh one of "
               "tempfile's: 0700, a random name made O_EXCL), run by hand by the user on her own machine")

REVIEWED: dict[str, tuple[str, str, dict[tuple[str, str], int]]] = {
    # --- prepare: through dirfd (lock.parent, make_temp) --------------------------------------------------------
    "minilmd/corpus/prepare/pipeline.py": ("private", "--out's directories above it are checked by dirfd's rule "
                                           "before this mkdir (no one else can rearrange them); the rest is inside "
                                           "the temporary directory: " + PRIVATE_TMP, {
        ("_prepare_into", ".mkdir"): 1, ("_prepare_into", ".write_bytes"): 1,
        ("_prepare_into", ".write_text"): 1}),
    "minilmd/corpus/prepare/collect.py": ("private", PRIVATE_TMP, {
        ("SplitWriter.__init__", "open"): 2, ("Spool.__init__", "open"): 1, ("Spool.close", ".unlink"): 1,
        ("Collector.__init__", "open"): 1, ("leak_check", ".unlink"): 1, ("write_splits", ".unlink"): 2,
        ("write_splits", "np.save"): 2, ("copy_kept", "open"): 1}),
    "minilmd/corpus/prepare/badlines.py": ("private", PRIVATE_TMP + " (the spool; its move beside --out is "
                                           "dirfd's)", {("BadLines.add", "open"): 1}),
    "minilmd/corpus/prepare/append.py": ("private", "inside the corpus directory opened under the lock (refused "
                                         "when others can write it) or the append's temporary directory: "
                                         + PRIVATE_TMP, {
        ("_append", ".mkdir"): 1, ("_new_documents", ".unlink"): 2, ("_new_documents", "os.replace"): 2,
        ("_publish", "np.save"): 1}),  # np.save: into a file object made O_EXCL at the split's descriptor
    # --- core helpers, by the place their callers give ------------------------------------------------------------
    "minilmd/jsonlines.py": ("gap", RUN_DIR + " (the one way to append there: metrics.jsonl, events.jsonl, "
                             "supervisor.log, the attempt logs, faults-fired; O_APPEND|O_CREAT|O_NOFOLLOW|O_NONBLOCK "
                             "by path, a regular file only, a line whole)", {("open_log", "os.open"): 1}),
    "minilmd/fsio.py": ("private", "crash-safe writes by path, for places their callers own: state.json in run.dir, "
                        "scratch, a corpus's meta.json inside a checked directory; a registry entry, linked to "
                        "its name only while the name is free (registry.py)", {
        ("atomic_write_text", "tempfile.mkstemp"): 1, ("atomic_write_text", "os.link"): 1,
        ("atomic_write_text", "os.replace"): 1, ("atomic_write_text", "os.unlink"): 1}),
    "minilmd/scratch.py": ("private", PRIVATE_SCRATCH, {
        ("_make_private_dir", "os.mkdir"): 1, ("claim", ".mkdir"): 1, ("_write_marker", "os.open"): 1,
        ("_write_marker", "open"): 1, ("_write_marker", "os.link"): 1, ("_write_marker", ".unlink"): 1,
        ("remove_own", "shutil.rmtree"): 1}),
    "minilmd/scratch_end.py": ("private", PRIVATE_SCRATCH + " (the staged copies a run that failed for good gives "
                               "back, each a directory found by lstat after ensure_held)", {
        ("release_inputs", "shutil.rmtree"): 1}),
    "minilmd/scratch_root.py": ("private", "the default scratch's per-user root in the sticky base (/dev/shm): "
                                "mkdir 0700 never replaces what is there (what stands there is then judged, lstat, "
                                "and another user's, a link or a file is never used), and mkdtemp makes a new name "
                                "O_EXCL, 0700; the record goes in run.dir through fsio (run.dir's rule); a root "
                                "whose record could not be written is rmdir'd at once: the name this try's mkdtemp "
                                "made, which in the sticky base no one else may rename, and rmdir removes only an "
                                "empty directory", {
        ("settle", "os.mkdir"): 1, ("settle", "tempfile.mkdtemp"): 1, ("settle", "os.rmdir"): 1}),
    "minilmd/shared_place.py": ("private", PRIVATE_SCRATCH + " (the staged corpus's source record)", {
        ("record_staged_from", "os.unlink"): 1}),
    "minilmd/checkpoint_dirs.py": ("private", PRIVATE_SCRATCH + " (quarantine of a local checkpoint)", {
        ("quarantine", ".mkdir"): 1, ("quarantine", "os.rename"): 1, ("quarantine", ".write_text"): 1}),
    "minilmd/checkpoint_select.py": ("private", PRIVATE_SCRATCH + " (pruning local checkpoints)", {
        ("prune", "os.rename"): 1, ("prune", "shutil.rmtree"): 1}),
    "minilmd/lockfile.py": ("private", "every lock file (run, trainer, corpus, GPU lease) made O_CREAT|O_EXCL|"
                            "O_NOFOLLOW at the descriptor of a directory its caller opened checked (dirfd's Dir, the "
                            "place rule's walk, run.dir opened once), an existing one opened O_NOFOLLOW|O_NONBLOCK "
                            "there and checked (regular, one link, ours) before it is written; a replacement's "
                            "guard (`.NAME.guard`) removed only by its maker, holding it, while its name leads to it", {
        ("open_lock", "os.open@dir_fd"): 2, ("fresh", "os.open@dir_fd"): 1, ("fresh", "os.rename@dir_fd"): 1,
        ("fresh", "os.unlink@dir_fd"): 1, ("guarded", "os.unlink@dir_fd"): 1}),
    "minilmd/corpus/demo_chat.py": ("gap", OWN_OUTPUT, {("write_multiturn_chat_corpus", "open"): 1}),
    "minilmd/corpus/demo_text.py": ("gap", OWN_OUTPUT, {("write_repeated_chat_corpus", "open"): 1}),
    "minilmd/corpus/tokenizer_train.py": ("gap", OWN_OUTPUT, {("train_tokenizer", ".mkdir"): 1}),
    # --- the supervisor ---------------------------------------------------------------------------------------------
    "daemon/child/compilecache.py": ("private", PRIVATE_SCRATCH + " (the run's compile caches)",
                                     {("clear_damaged", ".unlink"): 1}),
    "daemon/child/death.py": ("gap", RUN_DIR, {("_own_fault", ".unlink"): 1}),
    "daemon/child/process.py": ("gap", RUN_DIR, {("launch", ".mkdir"): 1, ("launch", ".unlink"): 1}),
    "daemon/demo.py": ("private", DEMO_DIR + " (its config; the directory itself made at its parent's descriptor, "
                        "dirfd's Dir)", {("main", ".write_text"): 1, ("_fresh_in", "os.mkdir@dir_fd"): 1}),
    "daemon/demo_sft.py": ("private", DEMO_DIR + " (the SFT tokenizer and config)", {
        ("main", ".mkdir"): 1, ("main", ".write_bytes"): 1, ("main", ".write_text"): 2}),
    "daemon/demo_dpo.py": ("private", DEMO_DIR + " (its DPO config)", {("dpo_stage", ".write_text"): 1}),
    "daemon/host/registry.py": ("private", "the per-user registry (0700, this user's) and the system one (root's, "
                                "sticky: no one else may rename or remove this user's entry; a taken name is "
                                "never replaced: registry.py)", {
        ("_own_private_dir", ".mkdir"): 1, ("_own_private_dir", "os.chmod"): 1, ("forget", "os.unlink"): 1}),
    "daemon/host/leases.py": ("private", "a held GPU lease file's times set to now (futimens) through the "
                              "descriptor it is flocked by, only when the file is this user's own (`writable`) and "
                              "its name still leads to it (leases.keep): no name followed, no body written, "
                              "another user's file never touched", {("keep", "os.utime"): 1}),
    "daemon/jobs/basecopy.py": ("private", PRIVATE_SCRATCH + " (the base's copy fetched from the remote)", {
        ("fetch", ".mkdir"): 2, ("fetch", ".write_bytes"): 2, ("stage_from_remote", "shutil.rmtree"): 1}),
    "daemon/jobs/initstage.py": ("private", PRIVATE_SCRATCH + " (the staged probe and init weights)", {
        ("_copy", ".mkdir"): 1, ("_copy", "open"): 1, ("_copy_listed", ".mkdir"): 1, ("_copy_listed", "open"): 1,
        ("_copy_pth", "open"): 1, ("fresh_tmp", "shutil.rmtree"): 1, ("fresh_tmp", ".mkdir"): 1,
        ("stage_probe", ".write_bytes"): 1, ("_copy_checkpoint", ".mkdir"): 1, ("_copy_checkpoint", ".write_bytes"): 1,
        ("staged_whole", "shutil.rmtree"): 1}),
    "daemon/jobs/remote.py": ("gap", REMOTE + "; a fetched file into scratch", {
        ("Remote.get", "open"): 1, ("Remote.put", "open"): 1, ("Remote.replace_own", ".pipe_file"): 1,
        ("Remote.put_new", ".pipe_file"): 1, ("Remote.write_latest", ".pipe_file"): 1,
        ("Remote.makedirs", ".makedirs"): 1, ("Remote.rm", ".rm"): 1}),
    "daemon/jobs/staging.py": ("private", PRIVATE_SCRATCH + " (the staged corpus)", {
        ("_Copier.copy", ".unlink"): 1, ("_Copier._copy_once", ".mkdir"): 1, ("_Copier._copy_once", ".unlink"): 2,
        ("_Copier._copy_once", "os.link"): 1, ("_Copier._copy_once", "open"): 1,
        ("_Copier._copy_once", "os.replace"): 1, ("stage", ".mkdir"): 4,
        ("stage", "shutil.rmtree"): 3, ("stage", "os.rename"): 3, ("stage", ".write_bytes"): 1}),
    "daemon/jobs/remote_made.py": ("private", PRIVATE_SCRATCH + " (an older minilmd's record of what the run's syncs "
                                   "made on the remote, beside its checkpoint root: removed once read into the one in "
                                   "run.dir, which fsio.atomic_write_json writes as state.json)",
                                   {("Made._adopt_old", ".unlink"): 1}),
    "daemon/jobs/fetch.py": ("private", PRIVATE_SCRATCH + " (a remote checkpoint fetched into scratch)", {
        ("Fetcher._fetch_latest", ".mkdir"): 1, ("Fetcher._read_one", "shutil.rmtree"): 3,
        ("Fetcher._read_one", ".mkdir"): 1, ("Fetcher._download", ".write_bytes"): 1}),
    "daemon/runfiles.py": ("gap", RUN_DIR, {("RunFiles.__init__", ".mkdir"): 1}),
    "daemon/base/runstate.py": ("private", "/dev/null put under a lost stdout (EventLog._echo)", {
        ("EventLog._echo", "os.open"): 1}),
    "daemon/attempt.py": ("gap", RUN_DIR, {("Attempt._launch", ".unlink"): 1}),  # moved from supervisor.py
    # --- the device checks and the scripts: their own --work directory ------------------------------------------
    **{script: ("private", SCRIPT_WORK, sites_of_script) for script, sites_of_script in {
        "scripts/docmask_val_pair.py": {("run_pair", "tempfile.TemporaryDirectory"): 1},
        "scripts/dpo_lr_sweep.py": {("main", ".mkdir"): 1, ("main", ".write_text"): 1},
        "scripts/dpo_steps_sidebyside.py": {
            ("compare", ".mkdir"): 1, ("compare", ".write_text"): 2, ("main", "shutil.rmtree"): 1,
            ("main", "tempfile.mkdtemp"): 1, ("run_minilmd", ".write_text"): 1, ("write_weights", ".mkdir"): 1},
        "scripts/gpu-check": {
            ("main", ".mkdir"): 1, ("main", ".write_text"): 1, ("main", "shutil.rmtree"): 1,
            ("main", "tempfile.mkdtemp"): 1, ("part_corpus", "open"): 1, ("part_corpus", "shutil.rmtree"): 1,
            ("spawn", ".write_text"): 1},
        "scripts/gpu_check_determinism.py": {("cost_of_determinism", "shutil.rmtree"): 1},
        "scripts/gpu_check_dpo.py": {
            ("minilmd_dpo", "open"): 1, ("minilmd_sft", "open"): 1, ("minilmd_sft", "shutil.rmtree"): 1,
            ("part_dpo", "shutil.rmtree"): 1, ("write_pairs", "open"): 1},
        "scripts/gpu_check_part.py": {("together", "tempfile.TemporaryFile"): 1, ("write_config", ".write_text"): 1,
                                      ("write_config", "shutil.rmtree"): 1},
        "scripts/gpu_check_sft.py": {
            ("chatml_tokenizer_dir", ".mkdir"): 1, ("chatml_tokenizer_dir", ".write_bytes"): 1,
            ("chatml_tokenizer_dir", ".write_text"): 1, ("chatml_tokenizer_dir", "shutil.rmtree"): 1,
            ("prepare_chat", "shutil.rmtree"): 1, ("write_chats", "open"): 1},
        "scripts/gpu_check_sidebyside.py": {("copy_minimind", "shutil.copytree"): 1,
                                            ("copy_minimind", "shutil.rmtree"): 1},
        "scripts/gpu_check_train.py": {("part_run", ".write_text"): 1},
        "scripts/lora_size.py": {("<module>", "shutil.rmtree"): 1, ("<module>", "tempfile.mkdtemp"): 1},
        "scripts/scratch_start_cost.py": {("main", "shutil.rmtree"): 1, ("main", "tempfile.mkdtemp"): 1,
                                          ("measure", "shutil.rmtree"): 1},
        "scripts/resume_load_cost.py": {("main", "shutil.rmtree"): 1, ("main", "tempfile.mkdtemp"): 1},
    }.items()},
    # --- the trainer ------------------------------------------------------------------------------------------------
    "minilmd/compile_cache.py": ("private", PRIVATE_SCRATCH + " (the run's compile caches), a bench's own temporary "
                                 "directory (tempfile's: 0700, a random name made O_EXCL), or a directory the user set "
                                 "that compile_cache.user_dir_problem (the place rule's walk) passed, judged again "
                                 "once made", {
        ("settle", "os.makedirs"): 2, ("private_caches", "tempfile.mkdtemp"): 1,
        ("private_caches", "shutil.rmtree"): 1}),
    "minilmd/corpus/bench/append.py": ("private", "a benchmark's own temporary directory", {
        ("generate", "open"): 1, ("generate", ".unlink"): 1, ("bench_append", ".mkdir"): 1,
        ("bench_append", "shutil.rmtree"): 1, ("bench_append", "tempfile.mkdtemp"): 1}),
    "trainer/bench/checkpoint.py": ("private", "a benchmark's own temporary directory (tempfile's: 0700, a random "
                                    "name made O_EXCL; never a fixed name: tests/test_bench_checkpoint.py)", {
        ("work_dir", "tempfile.mkdtemp"): 1, ("main", "shutil.rmtree"): 1, ("main", "open"): 1,
        ("main", "torch.save"): 1}),  # into the file object opened just above
    "trainer/bench/packing.py": ("private", "a benchmark's own temporary directory (tempfile's: 0700, a random "
                                 "name made O_EXCL)", {("compare", "tempfile.TemporaryDirectory"): 1}),
    "trainer/bench/sft.py": ("private", "a benchmark's own temporary directory (tempfile's: 0700, a random name "
                             "made O_EXCL)", {("compare", "tempfile.TemporaryDirectory"): 1}),
    "minilmd/corpus/bench/prepare.py": ("private", "a benchmark's own temporary directory", {
        ("run_prepare", "open"): 1, ("bench_prepare", "shutil.rmtree"): 1, ("bench_chat_prepare", "shutil.rmtree"): 1,
        ("bench_prepare", "tempfile.mkdtemp"): 1, ("bench_chat_prepare", "tempfile.mkdtemp"): 1}),
    "trainer/checkpoint/save.py": ("private", PRIVATE_SCRATCH + " (a checkpoint being saved)", {
        ("_write_bytes", "open"): 1, ("_write_safetensors", "open"): 1, ("save", ".mkdir"): 1,
        ("save", "shutil.rmtree"): 3, ("_write_checkpoint", ".mkdir"): 1}),  # the third: the half of a save whose
    # scratch was removed meanwhile (minilmd/checkpoint_pin.py ScratchGone), under the very root it saves into
    "minilmd/checkpoint_pin.py": ("private", PRIVATE_SCRATCH + " (the trainer's checkpoint root, made once at its "
                                  "start; under a supervisor only inside the claimed scratch, never its parents)",
                                  {("pin_root", ".mkdir"): 1}),
    "trainer/loop/tensorboard.py": ("gap", RUN_DIR + " (<run.dir>/tensorboard: TensorBoard's SummaryWriter "
                                    "makes it and writes its event files there by name)",
                                    {("tee", "SummaryWriter"): 1}),
    "trainer/loop/faults.py": ("private", "test fault injection (MINILMD_FAULT): the SIGBUS page in a nameless "
                               "temporary file (tempfile's, O_TMPFILE); faults-fired is appended through "
                               "minilmd/jsonlines.py", {("_sigbus", "tempfile.TemporaryFile"): 1}),
    "minilmd/metrics.py": ("gap", RUN_DIR + " (run.dir made if missing, never under a supervisor; metrics.jsonl "
                           "through minilmd/jsonlines.py, the heartbeat by fsio.atomic_write_text)",
                           {("MetricsLog._need_run_dir", ".mkdir"): 1}),
    "trainer/loop/entry.py": ("gap", RUN_DIR + "; and scratch (on a scratch with no room, the empty directories "
                              "its own claim has just made removed again: rmdir, never a file)",
                              {("run", ".unlink"): 1, ("remove_empty_tree", "os.rmdir"): 2}),  # moved from train.py
    "trainer/model/adapter.py": ("private", "export --out (an HF PEFT directory): " + PRIVATE_TMP + " (export_paths."
                                 "ExportCopy, in the directory of --out checked by dirfd's rule); the base's private "
                                 "copy in a fresh 0700 directory of tempfile's", {
        ("export_peft", ".write_text"): 1, ("export_peft", "safetensors.save_file"): 1,
        ("_from_copy", "tempfile.TemporaryDirectory"): 1}),
    "trainer/model/basecopy_read.py": ("private", "a private copy in a fresh 0700 directory of this user's", {
        ("private_copy", ".mkdir"): 1, ("private_copy", ".write_bytes"): 2, ("private_copy", "open"): 1}),
    "trainer/model/export_paths.py": ("private", "a new file made O_CREAT|O_EXCL|O_NOFOLLOW at the descriptor of "
                                       "the export's 0700 temporary directory (Dir.make_temp): " + PRIVATE_TMP, {
        ("ExportCopy.new_file", "os.open@dir_fd"): 1}),
    "trainer/model/export.py": ("private", "export --out: " + PRIVATE_TMP + " (export_paths.ExportCopy, in the "
                                "directory of --out checked by dirfd's rule); a MiniMind .pth through its O_EXCL "
                                "file object made at the copy's descriptor", {
        ("_write_hf", ".write_text"): 1, ("_write_hf", ".write_bytes"): 1, ("_write_hf", "safetensors.save_file"): 1,
        ("write_minimind", "torch.save"): 1}),
}



def test_every_write_by_path_is_reviewed_and_none_is_new():
    problems = differences(sites(), REVIEWED)
    assert not problems, ("by-path creates/renames/chmods/deletes whose count differs from REVIEWED "
                          "(tests/test_shared_write_audit.py): put a new one through minilmd/dirfd.py's Dir where "
                          "others may write, or add it to REVIEWED with the reason its place is private; remove a "
                          "review whose call is gone:\n  " + "\n  ".join(problems))


def test_every_review_says_why():
    assert not unexplained(REVIEWED)


RUN_DIR_OPEN_PENDING: dict[str, str] = {}
"""Files still opening a file in run.dir for writing with open(), each with why it is still there."""


def test_nothing_in_run_dir_is_opened_for_writing_by_open():
    """Every append into run.dir goes through minilmd/jsonlines.py (open_log: no link followed, no FIFO written or
    waited on, a line whole): an open() or Path.open() for writing there follows a link and blocks on a FIFO (before
    (house9 item 2): the trainer appended metrics.jsonl by open(), through a link planted there, and crashed on a
    FIFO at its start)."""
    found = [f"{path}: {function}: {call}" for path, (_, why, counted) in REVIEWED.items()
             if RUN_DIR in why and path not in RUN_DIR_OPEN_PENDING
             for (function, call) in counted if call in ("open", ".open")]
    assert not found, "a file in run.dir opened for writing by open(): use minilmd/jsonlines.py:\n" + "\n".join(found)


PROBE = """\
import os, shutil, tempfile
import shutil as sh
import numpy as np
import safetensors.torch
from os import rename, open as os_open
from pathlib import Path
from safetensors.torch import save_file
from tempfile import mkstemp as make_temp
from minilmd.jsonlines import LOG_APPEND
from minilmd.place_rule import WALK_DIR
NEW = os.O_WRONLY | os.O_CREAT

def f(p, d, flags, arr):
    os.chmod(p, 0o644)
    os.chmod('x', 0o644, dir_fd=d)
    Path(p).write_text('x')
    'a'.replace('a', 'b')
    open(p, 'rb')
    open(p, 'x')
    shutil.rmtree(p)
    Path(p).replace(p)
    rename(p, p)
    sh.rmtree(p)
    os.open(p, os.O_RDONLY)
    os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    os.open(p, os.O_RDWR | os.O_CREAT, 0o644, dir_fd=d)
    os_open(p, NEW)
    os.open(p, LOG_APPEND)
    os.open(p, WALK_DIR)
    os.open(p, flags)
    os.open(p, os.O_WRONLY | os.O_TRUNC)
    os.open(p, os.O_APPEND | os.O_WRONLY)
    save_file({}, p)
    safetensors.torch.save_file({}, p)
    np.save(p, arr)
    np.savez(p, a=arr)
    arr.tofile(p)
    tempfile.NamedTemporaryFile(dir=p)
    make_temp(dir=p)
"""


def test_the_audit_sees_each_kind_of_call_by_any_name():
    """Each kind of by-path write is counted, under whatever name it was imported (an alias, a bare import), os.open's
    flags followed into the project module that defines them (LOG_APPEND creates, WALK_DIR does not); the same calls
    relative to a descriptor, or only reading, are not."""
    assert _Sites(ast.parse(PROBE)).found == Counter({
        ("f", "os.chmod"): 1, ("f", ".write_text"): 1, ("f", "open"): 1, ("f", "shutil.rmtree"): 2,
        ("f", ".replace"): 1, ("f", "os.rename"): 1, ("f", "os.open"): 6, ("f", "safetensors.save_file"): 2,
        ("f", "np.save"): 1, ("f", "np.savez"): 1, ("f", ".tofile"): 1, ("f", "tempfile.NamedTemporaryFile"): 1,
        ("f", "tempfile.mkstemp"): 1, ("f", "os.chmod@dir_fd"): 1, ("f", "os.open@dir_fd"): 1})
    in_a_home = _Sites(ast.parse(PROBE), descriptors_are_the_rule=True).found
    assert ("f", "os.chmod@dir_fd") not in in_a_home and ("f", "os.open@dir_fd") not in in_a_home


ESCAPES = """\
import codecs, gzip, os, shutil, subprocess, tarfile, zipfile
import numpy as np
from os import *
from posix import unlink as posix_unlink
from pathlib import Path

def f(p, q, mode, kw, arr, d):
    os.unlink(p, dir_fd=None)
    os.open(p, os.O_WRONLY | os.O_CREAT, dir_fd=None)
    os.open(p, 0o101)
    os.open(p, *kw)
    unlink(p)
    rename(p, q)
    posix_unlink(p)
    getattr(os, "unlink")(p)
    getattr(shutil, kw)(p)
    Path(p).rename(target=q)
    Path(p).open(mode)
    o = open; o(p, "w")
    codecs.open(p, "w")
    gzip.open(p, "wb")
    tarfile.open(p, "w:gz")
    zipfile.ZipFile(p, "a")
    np.memmap(p, mode="w+", shape=(4,))
    np.memmap(p, shape=(4,))
    shutil.chown(p, "nobody")
    shutil.copymode(p, q)
    shutil.copystat(p, q)
    os.mknod(p)
    os.utime(p)
    subprocess.run(["rm", "-rf", p])
    os.system(f"mv {p} {q}")
    subprocess.run(["/bin/cp", p, q])
    os.unlink(p, dir_fd=d)
    os.open(p, 0)
    gzip.open(p, "rb")
    np.memmap(p, mode="r", shape=(4,))
    subprocess.run(["ls", p])
"""


def test_every_other_spelling_of_a_write_is_counted():
    """dir_fd=None, flags as a number or unpacked, a star import, posix for os, getattr, a keyword target, a mode in
    a variable, open under another name, the compressing modules' open, zipfile, np.memmap (its default mode writes
    too), shutil's chown/copymode/copystat, os.mknod/utime, a file command run as a program: each is counted; a call
    at a real descriptor outside DIR_FD_HOMES is counted as such; reading ones are not."""
    assert _Sites(ast.parse(ESCAPES)).found == Counter({
        ("f", "os.unlink"): 4, ("f", "os.open"): 3, ("f", "os.rename"): 1, ("f", "shutil.<getattr>"): 1,
        ("f", ".rename"): 1, ("f", "open"): 2, ("f", "codecs.open"): 1, ("f", "gzip.open"): 1,
        ("f", "tarfile.open"): 1, ("f", "zipfile.ZipFile"): 1, ("f", "np.memmap"): 2, ("f", "shutil.chown"): 1,
        ("f", "shutil.copymode"): 1, ("f", "shutil.copystat"): 1, ("f", "os.mknod"): 1, ("f", "os.utime"): 1,
        ("f", "a file command"): 3, ("f", "os.unlink@dir_fd"): 1})


MODE_ESCAPES = """\
import os
from os import O_CREAT as C
from pathlib import Path
from minilmd.names import TRAINER_STATE

WRITE = "wb"

def f(p, how, fs, remote):
    m = "w"
    Path(p).open(m)
    fs.open(p, m)
    Path(p).open(mode=WRITE)
    Path(p).open(how)
    fs.open(p, "a" if how else "r")
    Path(p).open(m, -1)
    w = os.O_WRONLY
    os.open(p, w)
    os.open(p, C)
    r = "rb"
    Path(p).open(r)
    fs.open(p, r)
    remote.open(p, TRAINER_STATE)
    Path(p).open("r", how)
    n = "r"
    n += "+"
    Path(p).open(n)

class Remote:
    def open(self, *names):
        return self.fs.open(self.path(*names), "rb")

    def sha256(self, *names):
        with self.open(*names) as f:
            return f.read()
"""


def test_a_mode_or_a_flag_under_any_name_is_read():
    """A method's open (Path.open, fs.open) with its mode in a name of any spelling (`m = "w"`, a module constant,
    either branch of `if`, beside a buffering size), one it cannot read (a parameter, a name also bound otherwise)
    counted to be reviewed; os.open's flag under a name of its own (`w = os.O_WRONLY`, `import O_CREAT as C`): each
    is counted. A mode read as "rb", a path read as a project constant (TRAINER_STATE) in the mode's place, and the
    class's own open method called on self (read where it is defined) are not."""
    assert _Sites(ast.parse(MODE_ESCAPES)).found == Counter({("f", "open"): 7, ("f", "os.open"): 2})


FILESYSTEMS = """\
from torch.utils.tensorboard import SummaryWriter

def f(fs, self, remote, d, arr, local_fs):
    fs.pipe_file(p, b"x")
    self.fs.rm(p, recursive=True)
    self.fs.makedirs(p, exist_ok=True)
    local_fs.put(p, q)
    fs.mv(p, q)
    fs.touch(p)
    fs.cp_file(p, q)
    fs.rm_file(p)
    SummaryWriter(log_dir=p)
    remote.rm(p)
    remote.makedirs()
    d.get(p)
    arr.copy()
    fs.cat_file(p)
"""


def test_an_fsspec_filesystems_writes_and_a_tensorboard_writer_are_counted():
    """fsspec's writing methods by name (pipe_file, mv, touch, cp_file, rm_file), and those whose names other objects
    share (rm, makedirs, put) on a filesystem named as one; TensorBoard's writer. The project's store's own rm and
    makedirs (read where they are defined), dict.get, ndarray.copy and a read (cat_file) are not."""
    assert _Sites(ast.parse(FILESYSTEMS)).found == Counter({
        ("f", ".pipe_file"): 1, ("f", ".rm"): 1, ("f", ".makedirs"): 1, ("f", ".put"): 1, ("f", ".mv"): 1,
        ("f", ".touch"): 1, ("f", ".cp_file"): 1, ("f", ".rm_file"): 1, ("f", "SummaryWriter"): 1})


def test_a_review_whose_call_is_gone_or_one_more_call_fails():
    """Counts must match exactly: a site reviewed but gone is as much a finding as a new one."""
    found = {"a.py": Counter({("f", "os.rename"): 2, ("g", ".mkdir"): 1})}
    reviewed = {"a.py": ("private", "a reason long enough", {("f", "os.rename"): 1, ("g", ".mkdir"): 1,
                                                             ("h", "os.unlink"): 1}),
                "gone.py": ("gap", "a reason long enough", {("f", "open"): 1})}
    assert differences(found, reviewed) == ["a.py: f: os.rename x2 (reviewed: 1)",
                                            "a.py: h: os.unlink x0 (reviewed: 1)", "gone.py: f: open x0 (reviewed: 1)"]
    assert differences(found, {"a.py": ("private", "", dict(found["a.py"]))}) == []


def test_what_prepare_and_the_textfile_make_in_a_place_others_write_is_all_the_helpers():
    """The surfaces of issue 40 hold no by-path chmod, rename or delete of their own any more: the temporary
    directory's publication, the bad-lines list's move and mode, --force's swap and the Prometheus textfile."""
    found = sites()
    for module in ("minilmd/corpus/prepare/pipeline.py", "minilmd/corpus/prepare/badlines.py",
                   "minilmd/corpus/prepare/lock.py", "daemon/host/prometheus.py"):
        calls = {call for _, call in found.get(module, {})}
        assert not calls & {"os.chmod", "os.rename", "os.replace", "shutil.rmtree", ".rename", ".replace",
                            ".chmod", "os.unlink", ".unlink"}, (module, calls)
