"""Every call in minilmd that creates, renames, chmods or deletes by path, reviewed (issue 40: each surface got its
own guard, so each new surface started unguarded).

The audit walks the source of minilmd/, daemon/ and trainer/ and lists each such call: os.rename, replace, chmod,
unlink, remove, rmdir, mkdir, makedirs, link, symlink, mkfifo, truncate; shutil.rmtree, move, copy*; open() and
Path.open() for writing; Path.write_text/write_bytes/mkdir/unlink/rmdir/rename/replace/chmod/touch/symlink_to;
tempfile.mkstemp/mkdtemp; np.save. A call given a directory descriptor (dir_fd=, src_dir_fd=) is not by path.
minilmd/dirfd.py, the one way to write into a place others can change, is exempt. Every other site must be in
REVIEWED below, by (module, function, call) with how many, under the reason its place is safe: "private" (a
place of this user's alone: the run's 0700 scratch, a 0700 temporary directory of dirfd's reached by its
descriptor, a place checked by dirfd's rule before), or "gap" (a place others may write that does not go through
dirfd yet: named, so that the next change there knows; docs/failure-modes.md "Shared places" lists them). A new
site anywhere, or one more of a kind in a function, fails this test: put it through minilmd/dirfd.py's `Dir`, or
add it here with the reason its place is private.
"""
from __future__ import annotations

import ast
import functools
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("minilmd", "daemon", "trainer")
THE_HELPER = "minilmd/dirfd.py"
OS_CALLS = {"rename", "replace", "chmod", "unlink", "remove", "rmdir", "mkdir", "makedirs", "link", "symlink",
            "mkfifo", "truncate", "removedirs", "renames", "lchmod", "chown", "lchown"}
SHUTIL_CALLS = {"rmtree", "move", "copyfile", "copy", "copy2", "copytree"}
PATH_CALLS = {"write_text", "write_bytes", "mkdir", "unlink", "rmdir", "chmod", "touch", "symlink_to",
              "hardlink_to", "lchmod"}
ONE_ARG_CALLS = {"rename", "replace"}  # Path.rename(target); str.replace(a, b) takes two
FD_KEYWORDS = {"dir_fd", "src_dir_fd", "dst_dir_fd"}
WRITE_MODES = set("wxa+")

PRIVATE_SCRATCH = "the run's scratch: 0700, this user's, every directory above it checked (minilmd/scratch.py)"
PRIVATE_TMP = ("inside a 0700 temporary directory of dirfd's (Dir.make_temp), reached as /proc/self/fd/N: no one "
               "else can write there, whatever its name leads to")
RUN_DIR = ("run.dir and what it holds (state, logs, metrics, the lock): the user's own directory, named in her "
           "config; not yet checked against others rearranging it")
REMOTE = ("run.remote (a local path): directories made new (O_EXCL mkdir), files O_EXCL|O_NOFOLLOW, only this "
          "user's removed (daemon/jobs/remote_write.py), but by path below its root: not yet through dirfd")
OWN_OUTPUT = ("a command's output the user names (--out of demo-corpus, tokenizer train, plot, bench): written by "
              "name as any tool's output; not hardened for a directory others write")

REVIEWED: dict[str, tuple[str, str, dict[tuple[str, str], int]]] = {
    # --- prepare: through dirfd (lock.parent, make_temp) --------------------------------------------------------
    "minilmd/corpus/prepare/pipeline.py": ("private", "--out's directories above it are checked by dirfd's rule "
                                           "before this mkdir (no one else can rearrange them); the rest is inside "
                                           "the temporary directory: " + PRIVATE_TMP, {
        ("_make_parents", "os.mkdir"): 1, ("_prepare_into", ".mkdir"): 1, ("_prepare_into", "shutil.copyfile"): 1,
        ("_prepare_into", ".write_text"): 1}),
    "minilmd/corpus/prepare/collect.py": ("private", PRIVATE_TMP, {
        ("SplitWriter.__init__", "open"): 2, ("Spool.__init__", "open"): 1, ("Spool.close", ".unlink"): 1,
        ("Collector.__init__", "open"): 1, ("leak_check", ".unlink"): 1, ("write_splits", ".unlink"): 2,
        ("write_splits", "np.save"): 2, ("_copy_kept", "open"): 1}),
    "minilmd/corpus/prepare/badlines.py": ("private", PRIVATE_TMP + " (the spool; its move beside --out is "
                                           "dirfd's)", {("BadLines.add", "open"): 1}),
    "minilmd/corpus/prepare/append.py": ("private", "inside the corpus directory opened under the lock (refused "
                                         "when others can write it) or the append's temporary directory: "
                                         + PRIVATE_TMP, {
        ("_remove_stale_parts", ".unlink"): 1, ("_append", ".mkdir"): 1, ("_new_documents", ".unlink"): 2,
        ("_new_documents", "os.replace"): 2, ("_append_bytes", "open"): 1, ("_publish", "os.replace"): 1,
        ("_publish", "np.save"): 1}),
    # --- core helpers, by the place their callers give ------------------------------------------------------------
    "minilmd/fsio.py": ("private", "crash-safe writes by path, for places their callers own: state.json in run.dir, "
                        "scratch, a corpus's meta.json inside a checked directory; the remote's pointer "
                        "(mkstemp: O_EXCL|O_NOFOLLOW)", {
        ("publish_file", "os.replace"): 1, ("atomic_write_text", "tempfile.mkstemp"): 1,
        ("atomic_write_text", "os.replace"): 1, ("atomic_write_text", "os.unlink"): 1, ("publish_dir", "os.rename"): 4,
        ("publish_dir", "shutil.rmtree"): 1, ("rename_new", "os.rename"): 1}),
    "minilmd/leftovers.py": ("gap", "a killed maker's leftover beside an output: only this user's real directory, "
                             "its maker gone; prepare sweeps only where no one else can rearrange (not with "
                             "--group-share); an export's --out and a remote's checkpoint root still by path", {
        ("remove", "shutil.rmtree"): 1, ("remove", ".unlink"): 1}),
    "minilmd/scratch.py": ("private", PRIVATE_SCRATCH, {
        ("_make_private_dir", "os.mkdir"): 1, ("claim", ".mkdir"): 1, ("_write_marker", "open"): 1,
        ("_write_marker", "os.link"): 1, ("_write_marker", ".unlink"): 1, ("remove_own", "shutil.rmtree"): 1,
        ("release_inputs", "shutil.rmtree"): 1}),
    "minilmd/checkpoint_dirs.py": ("private", PRIVATE_SCRATCH + " (quarantine of a local checkpoint)", {
        ("quarantine", ".mkdir"): 1, ("quarantine", "os.rename"): 1, ("quarantine", ".write_text"): 1}),
    "minilmd/checkpoint_select.py": ("private", PRIVATE_SCRATCH + " (pruning local checkpoints)", {
        ("prune", "os.rename"): 1, ("prune", "shutil.rmtree"): 1}),
    "minilmd/corpus/demo_chat.py": ("gap", OWN_OUTPUT, {("write_chat_corpus", ".mkdir"): 1,
                                                        ("write_chat_corpus", "open"): 1,
                                                        ("write_multiturn_chat_corpus", "open"): 1}),
    "minilmd/corpus/demo_text.py": ("gap", OWN_OUTPUT, {
        ("_write_jsonl", "open"): 1, ("write_demo_corpus", ".mkdir"): 1, ("write_repeated_corpus", "open"): 1,
        ("write_repeated_chat_corpus", "open"): 1}),
    "minilmd/corpus/tokenizer_train.py": ("gap", OWN_OUTPUT, {("train_tokenizer", ".mkdir"): 1}),
    # --- the supervisor ---------------------------------------------------------------------------------------------
    "daemon/child/compilecache.py": ("private", PRIVATE_SCRATCH + " (the run's compile caches)",
                                     {("clear_damaged", ".unlink"): 1}),
    "daemon/child/process.py": ("gap", RUN_DIR, {("launch", ".mkdir"): 1, ("launch", ".unlink"): 1,
                                                 ("launch", "open"): 1, ("_own_fault", ".unlink"): 1}),
    "daemon/child/stackdump.py": ("gap", RUN_DIR + " (the trainer's log)", {("dump_stack", "open"): 1,
                                                                           ("_dump_by_sigusr1", "open"): 2}),
    "daemon/demo.py": ("private", "the demo's own directory under pytest's or the user's temporary directory", {
        ("fresh_start", "shutil.rmtree"): 1, ("fresh_start", ".mkdir"): 1, ("main", ".write_text"): 1}),
    "daemon/demo_sft.py": ("private", "the demo's own directory", {
        ("main", ".mkdir"): 1, ("main", ".write_bytes"): 1, ("main", ".write_text"): 2}),
    "daemon/host/leases.py": ("private", "the GPU lock directory and the missing ones above it, made after the "
                              "chain above is checked (leases.py: the rule dirfd keeps), then used by descriptor", {
        ("_make_parents", "os.mkdir"): 1, ("_open_dir", "os.mkdir"): 1}),
    "daemon/host/lock.py": ("gap", RUN_DIR, {("RunLock.acquire", ".mkdir"): 1}),
    "daemon/host/registry.py": ("private", "the per-user registry (0700, this user's) and the system one (root's, "
                                "sticky: no one else may rename or remove this user's entry; a taken name is "
                                "never replaced: registry.py)", {
        ("_own_private_dir", ".mkdir"): 1, ("_own_private_dir", "os.chmod"): 1, ("_publish", "os.replace"): 1,
        ("_publish", "os.link"): 1, ("_publish", "os.unlink"): 1, ("forget", "os.unlink"): 1,
        ("_publish", "tempfile.mkstemp"): 1}),
    "daemon/jobs/basecopy.py": ("gap", REMOTE + "; and the run's scratch", {
        ("fetch", ".mkdir"): 2, ("fetch", ".write_bytes"): 2, ("stage_from_remote", "shutil.rmtree"): 1}),
    "daemon/jobs/initstage.py": ("private", PRIVATE_SCRATCH + " (the staged probe and init weights)", {
        ("_copy", ".mkdir"): 1, ("_copy", "open"): 1, ("_copy_listed", ".mkdir"): 1, ("_copy_listed", "open"): 1,
        ("_copy_pth", "open"): 1, ("fresh_tmp", "shutil.rmtree"): 1, ("fresh_tmp", ".mkdir"): 1,
        ("stage_probe", ".write_bytes"): 1, ("stage_probe", "shutil.rmtree"): 1, ("stage_init", ".mkdir"): 1,
        ("stage_init", ".write_bytes"): 1, ("stage_init", "shutil.rmtree"): 1}),
    "daemon/jobs/remote.py": ("gap", REMOTE + "; a fetched file into scratch", {
        ("Remote.get", "open"): 1, ("Remote.makedirs", "os.makedirs"): 1, ("Remote.put", "open"): 1}),
    "daemon/jobs/remote_write.py": ("gap", REMOTE, {
        ("remove_ours", "os.unlink"): 1, ("remove_ours", "shutil.rmtree"): 1, ("mkdir_new", "os.mkdir"): 1,
        ("set_aside", "os.rename"): 1}),
    "daemon/jobs/staging.py": ("private", PRIVATE_SCRATCH + " (the staged corpus)", {
        ("_Copier.copy", ".unlink"): 1, ("_Copier._copy_once", ".mkdir"): 1, ("_Copier._copy_once", ".unlink"): 2,
        ("_Copier._copy_once", "os.link"): 1, ("_Copier._copy_once", "open"): 1,
        ("_Copier._copy_once", "os.replace"): 1, ("stage", ".mkdir"): 4,
        ("stage", "shutil.rmtree"): 3, ("stage", "os.rename"): 3, ("stage", ".write_bytes"): 1}),
    "daemon/jobs/fetch.py": ("private", PRIVATE_SCRATCH + " (a remote checkpoint fetched into scratch)", {
        ("Fetcher._fetch_latest", ".mkdir"): 1, ("Fetcher._fetch_one", "shutil.rmtree"): 3,
        ("Fetcher._fetch_one", ".mkdir"): 1, ("Fetcher._download", ".write_bytes"): 1}),
    "daemon/phases/rundirwatch.py": ("gap", RUN_DIR + " (its space reserve)", {
        ("make_reserve", "open"): 1, ("make_reserve", ".unlink"): 1, ("release_reserve", ".unlink"): 1}),
    "daemon/runfiles.py": ("gap", RUN_DIR, {("RunFiles.__init__", ".mkdir"): 1}),
    "daemon/supervisor.py": ("gap", RUN_DIR, {("Supervisor.run", ".mkdir"): 1, ("Supervisor._launch", ".unlink"): 1}),
    "daemon/views/plot.py": ("gap", OWN_OUTPUT, {("plot", ".mkdir"): 1}),
    # --- the trainer ------------------------------------------------------------------------------------------------
    "minilmd/corpus/bench/append.py": ("private", "a benchmark's own temporary directory", {
        ("generate", "open"): 1, ("generate", ".unlink"): 1, ("bench_append", ".mkdir"): 1,
        ("bench_append", "shutil.rmtree"): 1, ("bench_append", "tempfile.mkdtemp"): 1}),
    "trainer/bench/checkpoint.py": ("private", "a benchmark's own temporary directory", {
        ("main", "shutil.rmtree"): 2, ("main", ".mkdir"): 1, ("main", "open"): 1}),
    "minilmd/corpus/bench/prepare.py": ("private", "a benchmark's own temporary directory", {
        ("run_prepare", "open"): 1, ("bench_prepare", "shutil.rmtree"): 1, ("bench_chat_prepare", "shutil.rmtree"): 1,
        ("bench_prepare", "tempfile.mkdtemp"): 1, ("bench_chat_prepare", "tempfile.mkdtemp"): 1}),
    "trainer/checkpoint/save.py": ("private", PRIVATE_SCRATCH + " (a checkpoint being saved)", {
        ("_write_bytes", "open"): 1, ("_write_safetensors", "open"): 1, ("save", ".mkdir"): 1,
        ("save", "shutil.rmtree"): 2, ("_write_checkpoint", ".mkdir"): 1}),
    "trainer/loop/faults.py": ("private", "test fault injection (MINILMD_FAULT): the run's own files", {
        ("FaultInjector.maybe_fire", "open"): 1, ("_sigbus", "os.unlink"): 1}),
    "minilmd/metrics.py": ("gap", RUN_DIR + " (metrics.jsonl, the heartbeat)", {
        ("MetricsLog.__init__", ".mkdir"): 1, ("MetricsLog._end_torn_line", "open"): 1, ("MetricsLog.write", "open"): 1,
        ("MetricsLog.heartbeat", ".write_text"): 1, ("MetricsLog.heartbeat", "os.replace"): 1}),
    "trainer/loop/train.py": ("gap", RUN_DIR + "; and scratch", {("run", ".mkdir"): 1, ("run", ".unlink"): 1}),
    "trainer/model/adapter.py": ("gap", "export --out (an HF PEFT directory): export_paths.py's fresh temporary "
                                 "directory beside --out, by path", {("export_peft", ".write_text"): 1}),
    "trainer/model/basecopy_read.py": ("private", "a private copy in a fresh 0700 directory of this user's", {
        ("private_copy", ".mkdir"): 1, ("private_copy", ".write_bytes"): 2, ("private_copy", "open"): 1}),
    "trainer/model/export.py": ("gap", "export --out: export_paths.py's fresh temporary directory beside --out, "
                                "by path", {("_write_hf", ".write_text"): 1, ("_write_hf", ".write_bytes"): 1}),
    "trainer/model/export_paths.py": ("gap", "export --out: an O_EXCL temporary name of its maker beside --out, "
                                      "removed only when made by it (export_paths.py), by path", {
        ("_writing", ".mkdir"): 2, ("_remove_if_made", "shutil.rmtree"): 1, ("_remove_if_made", ".unlink"): 1,
        ("publish", "os.rename"): 1}),
}


def _mode(call: ast.Call, position: int) -> str | None:
    mode = call.args[position] if len(call.args) > position else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            mode = keyword.value
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return mode.value
    return None if mode is None else "?"  # a mode not spelled out: counted as a write, to be reviewed


def _kind(call: ast.Call) -> str | None:
    """What a call is when it writes by path ("os.rename", ".mkdir", "open", ...), else None."""
    if any(k.arg in FD_KEYWORDS for k in call.keywords):
        return None  # relative to a directory descriptor
    fn = call.func
    if isinstance(fn, ast.Name) and fn.id == "open":
        mode = _mode(call, 1)
        return "open" if mode is not None and (mode == "?" or WRITE_MODES & set(mode)) else None
    if not isinstance(fn, ast.Attribute):
        return None
    owner = fn.value.id if isinstance(fn.value, ast.Name) else None
    if owner == "os":
        return f"os.{fn.attr}" if fn.attr in OS_CALLS else None
    if owner == "shutil":
        return f"shutil.{fn.attr}" if fn.attr in SHUTIL_CALLS else None
    if owner == "tempfile":
        return f"tempfile.{fn.attr}" if fn.attr in ("mkstemp", "mkdtemp") and any(
            k.arg == "dir" for k in call.keywords) else None
    if owner in ("np", "numpy"):
        return "np.save" if fn.attr == "save" else None
    if fn.attr in PATH_CALLS:
        return f".{fn.attr}"
    if fn.attr in ONE_ARG_CALLS and len(call.args) == 1 and not call.keywords:
        return f".{fn.attr}"
    if fn.attr == "open":  # Path.open(mode), fs.open(path, mode): a mode spelled out
        modes = [a.value for a in [*call.args[:2], *(k.value for k in call.keywords if k.arg == "mode")]
                 if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value
                 and set(a.value) <= set("rwxab+t")]
        return ".open" if any(WRITE_MODES & set(m) for m in modes) else None
    return None


class _Sites(ast.NodeVisitor):
    def __init__(self) -> None:
        self.where: list[str] = []
        self.found: Counter = Counter()

    def _scope(self, node) -> None:
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_Call(self, node: ast.Call) -> None:
        kind = _kind(node)
        if kind:
            self.found[(".".join(self.where) or "<module>", "open" if kind == ".open" else kind)] += 1
        self.generic_visit(node)


@functools.cache
def sites() -> dict[str, Counter]:
    """{module: Counter((function, call))} of every by-path write in the project, the helper aside."""
    found = {}
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name == THE_HELPER:
                continue
            visitor = _Sites()
            visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
            if visitor.found:
                found[name] = visitor.found
    return found


def test_every_write_by_path_is_reviewed_and_none_is_new():
    new = []
    for module, found in sites().items():
        allowed = REVIEWED.get(module, ("", "", {}))[2]
        for (function, call), n in sorted(found.items()):
            if n > allowed.get((function, call), 0):
                new.append(f"{module}: {function}: {call} x{n} (reviewed: {allowed.get((function, call), 0)})")
    assert not new, ("by-path creates/renames/chmods/deletes not reviewed (tests/test_shared_write_audit.py): put "
                     "them through minilmd/dirfd.py's Dir where others may write, or add them to REVIEWED with the "
                     "reason their place is private:\n  " + "\n  ".join(new))


def test_every_review_says_why_and_the_audit_sees_what_it_must():
    for module, (place, reason, allowed) in REVIEWED.items():
        assert place in ("private", "gap") and len(reason) > 20 and allowed, module
    probe = ast.parse("import os, shutil\nfrom pathlib import Path\n"
                      "def f(p, d):\n    os.chmod(p, 0o644)\n    os.chmod('x', 0o644, dir_fd=d)\n"
                      "    Path(p).write_text('x')\n    'a'.replace('a', 'b')\n    open(p, 'rb')\n"
                      "    open(p, 'x')\n    shutil.rmtree(p)\n    Path(p).replace(p)\n")
    visitor = _Sites()
    visitor.visit(probe)
    assert visitor.found == Counter({("f", "os.chmod"): 1, ("f", ".write_text"): 1, ("f", "open"): 1,
                                     ("f", "shutil.rmtree"): 1, ("f", ".replace"): 1})


def test_what_prepare_and_the_textfile_make_in_a_place_others_write_is_all_the_helpers():
    """The surfaces of issue 40 hold no by-path chmod, rename or delete of their own any more: the temporary
    directory's publication, the bad-lines list's move and mode, --force's swap and the Prometheus textfile."""
    found = sites()
    for module in ("minilmd/corpus/prepare/pipeline.py", "minilmd/corpus/prepare/badlines.py",
                   "minilmd/corpus/prepare/lock.py", "daemon/host/prometheus.py"):
        calls = {call for _, call in found.get(module, {})}
        assert not calls & {"os.chmod", "os.rename", "os.replace", "shutil.rmtree", ".rename", ".replace",
                            ".chmod", "os.unlink", ".unlink"}, (module, calls)
