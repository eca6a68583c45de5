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
src_dir_fd=) is not by path. minilmd/dirfd.py, the one way to write into a place others can change, is exempt.
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
import functools
from collections import Counter

import source_tree

ROOT = source_tree.REPO
SOURCES = ("minilmd", "daemon", "trainer")
THE_HELPER = "minilmd/dirfd.py"
OS_CALLS = {"rename", "replace", "chmod", "unlink", "remove", "rmdir", "mkdir", "makedirs", "link", "symlink",
            "mkfifo", "truncate", "removedirs", "renames", "lchmod", "chown", "lchown"}
SHUTIL_CALLS = {"rmtree", "move", "copyfile", "copy", "copy2", "copytree"}
PATH_CALLS = {"write_text", "write_bytes", "mkdir", "unlink", "rmdir", "chmod", "touch", "symlink_to",
              "hardlink_to", "lchmod", "tofile"}
TEMPFILE_CALLS = {"mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryDirectory", "TemporaryFile",
                  "SpooledTemporaryFile"}
NUMPY_CALLS = {"save", "savez", "savez_compressed", "savetxt"}
SAFETENSORS_CALLS = {"save_file"}
TORCH_CALLS = {"save"}
SHORT = {"numpy": "np", "safetensors.torch": "safetensors", "safetensors.numpy": "safetensors"}
ONE_ARG_CALLS = {"rename", "replace"}  # Path.rename(target); str.replace(a, b) takes two
FD_KEYWORDS = {"dir_fd", "src_dir_fd", "dst_dir_fd"}
WRITE_MODES = set("wxa+")

PRIVATE_SCRATCH = "the run's scratch: 0700, this user's, every directory above it checked (minilmd/scratch.py)"
PRIVATE_TMP = ("inside a 0700 temporary directory of dirfd's (Dir.make_temp), reached as /proc/self/fd/N: no one "
               "else can write there, whatever its name leads to")
RUN_DIR = ("run.dir and what it holds (state, logs, metrics, the lock): the user's own directory, named in her "
           "config, written by name (not through dirfd); held to the place rule at run --check, the launch and "
           "minilmd train (place_rule.run_dir_problem; made and resolved in one walk: place_rule.settle_run_dir), so "
           "no other user can rearrange it or a directory above it")
REMOTE = ("run.remote's root itself, made by path when missing (the run's configuration), before dirfd opens and "
          "checks it (LocalRemote._root), after which everything below it is written at that descriptor; and a store's "
          "objects (fsspec, not a local path: no links, no renames)")
DEMO_DIR = ("the demo's own directory, judged by run.dir's place rule before anything is made in it (daemon/demo.py "
            "fresh_start: it and every directory above root's or this user's, none another user can rearrange, a "
            "link on the way only root's or ours); an earlier one removed only when it holds the demo's marker, "
            "through the descriptor of the directory holding it")
OWN_OUTPUT = ("an output a library call is given by name (train_tokenizer's `out`, the chat benchmark corpora's, "
              "which benchmarks and tests write into their own temporary directories): written by name as any "
              "tool's output; not hardened for a directory others write (the commands' outputs are: tokenizer train's "
              "and plot's --out, demo-corpus's OUT through fsio.write_out_text/write_out_bytes/open_out_dir)")

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
        ("write_splits", "np.save"): 2, ("_copy_kept", "open"): 1}),
    "minilmd/corpus/prepare/badlines.py": ("private", PRIVATE_TMP + " (the spool; its move beside --out is "
                                           "dirfd's)", {("BadLines.add", "open"): 1}),
    "minilmd/corpus/prepare/append.py": ("private", "inside the corpus directory opened under the lock (refused "
                                         "when others can write it) or the append's temporary directory: "
                                         + PRIVATE_TMP, {
        ("_append", ".mkdir"): 1, ("_new_documents", ".unlink"): 2, ("_new_documents", "os.replace"): 2,
        ("_publish", "np.save"): 1}),  # np.save: into a file object made O_EXCL at the split's descriptor
    # --- core helpers, by the place their callers give ------------------------------------------------------------
    "minilmd/fsio.py": ("private", "crash-safe writes by path, for places their callers own: state.json in run.dir, "
                        "scratch, a corpus's meta.json inside a checked directory; a registry entry, linked to "
                        "its name only while the name is free (registry.py)", {
        ("atomic_write_text", "tempfile.mkstemp"): 1, ("atomic_write_text", "os.link"): 1,
        ("atomic_write_text", "os.replace"): 1, ("atomic_write_text", "os.unlink"): 1, ("publish_dir", "os.rename"): 4,
        ("publish_dir", "shutil.rmtree"): 1}),
    "minilmd/leftovers.py": ("gap", "a killed maker's leftover beside an output: only this user's real directory, "
                             "its maker gone; prepare and export sweep only where no one else can rearrange "
                             "(dirfd's rule; not prepare --group-share); a remote's checkpoint root still by path", {
        ("remove", "shutil.rmtree"): 1, ("remove", ".unlink"): 1}),
    "minilmd/scratch.py": ("private", PRIVATE_SCRATCH, {
        ("_make_private_dir", "os.mkdir"): 1, ("claim", ".mkdir"): 1, ("_write_marker", "open"): 1,
        ("_write_marker", "os.link"): 1, ("_write_marker", ".unlink"): 1, ("remove_own", "shutil.rmtree"): 1,
        ("release_inputs", "shutil.rmtree"): 1}),
    "minilmd/shared_place.py": ("private", PRIVATE_SCRATCH + " (the staged corpus's source record)", {
        ("record_staged_from", "os.unlink"): 1}),
    "minilmd/checkpoint_dirs.py": ("private", PRIVATE_SCRATCH + " (quarantine of a local checkpoint)", {
        ("quarantine", ".mkdir"): 1, ("quarantine", "os.rename"): 1, ("quarantine", ".write_text"): 1}),
    "minilmd/checkpoint_select.py": ("private", PRIVATE_SCRATCH + " (pruning local checkpoints)", {
        ("prune", "os.rename"): 1, ("prune", "shutil.rmtree"): 1}),
    "minilmd/corpus/demo_chat.py": ("gap", OWN_OUTPUT, {("write_multiturn_chat_corpus", "open"): 1}),
    "minilmd/corpus/demo_text.py": ("gap", OWN_OUTPUT, {("write_repeated_chat_corpus", "open"): 1}),
    "minilmd/corpus/tokenizer_train.py": ("gap", OWN_OUTPUT, {("train_tokenizer", ".mkdir"): 1}),
    # --- the supervisor ---------------------------------------------------------------------------------------------
    "daemon/child/compilecache.py": ("private", PRIVATE_SCRATCH + " (the run's compile caches)",
                                     {("clear_damaged", ".unlink"): 1}),
    "daemon/child/process.py": ("gap", RUN_DIR, {("launch", ".mkdir"): 1, ("launch", ".unlink"): 1,
                                                 ("launch", "open"): 1, ("_own_fault", ".unlink"): 1}),
    "daemon/child/stackdump.py": ("gap", RUN_DIR + " (the trainer's log)", {("dump_stack", "open"): 1,
                                                                           ("_dump_by_sigusr1", "open"): 2}),
    "daemon/demo.py": ("private", DEMO_DIR + " (its config)", {("main", ".write_text"): 1}),
    "daemon/demo_sft.py": ("private", DEMO_DIR + " (the SFT tokenizer and config)", {
        ("main", ".mkdir"): 1, ("main", ".write_bytes"): 1, ("main", ".write_text"): 2}),
    "daemon/demo_dpo.py": ("private", DEMO_DIR + " (its DPO config)", {("dpo_stage", ".write_text"): 1}),
    "daemon/host/leases.py": ("private", "the GPU lock directory reached and made by the place rule's walk "
                              "(place_rule.walk_to), then used by descriptor; a lease file of ours reopened writable "
                              "through /proc/self/fd (the open file already judged, no name looked up again)", {
        ("_open_in", "os.open"): 1}),
    "daemon/host/lock.py": ("gap", RUN_DIR + " (supervisor.lock: O_NOFOLLOW|O_NONBLOCK, by path)", {
        ("RunLock.acquire", ".mkdir"): 1, ("RunLock.acquire", "os.open"): 1}),
    "daemon/host/registry.py": ("private", "the per-user registry (0700, this user's) and the system one (root's, "
                                "sticky: no one else may rename or remove this user's entry; a taken name is "
                                "never replaced: registry.py)", {
        ("_own_private_dir", ".mkdir"): 1, ("_own_private_dir", "os.chmod"): 1, ("forget", "os.unlink"): 1}),
    "daemon/jobs/basecopy.py": ("private", PRIVATE_SCRATCH + " (the base's copy fetched from the remote)", {
        ("fetch", ".mkdir"): 2, ("fetch", ".write_bytes"): 2, ("stage_from_remote", "shutil.rmtree"): 1}),
    "daemon/jobs/initstage.py": ("private", PRIVATE_SCRATCH + " (the staged probe and init weights)", {
        ("_copy", ".mkdir"): 1, ("_copy", "open"): 1, ("_copy_listed", ".mkdir"): 1, ("_copy_listed", "open"): 1,
        ("_copy_pth", "open"): 1, ("fresh_tmp", "shutil.rmtree"): 1, ("fresh_tmp", ".mkdir"): 1,
        ("stage_probe", ".write_bytes"): 1, ("_copy_checkpoint", ".mkdir"): 1, ("_copy_checkpoint", ".write_bytes"): 1,
        ("staged_whole", "shutil.rmtree"): 1}),
    "daemon/jobs/remote.py": ("gap", REMOTE + "; a fetched file into scratch", {
        ("Remote.get", "open"): 1, ("Remote.put", "open"): 1}),
    "daemon/jobs/remote_local.py": ("gap", REMOTE, {("LocalRemote._make_root", "os.makedirs"): 1}),
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
        ("Fetcher._fetch_latest", ".mkdir"): 1, ("Fetcher._fetch_one", "shutil.rmtree"): 3,
        ("Fetcher._fetch_one", ".mkdir"): 1, ("Fetcher._download", ".write_bytes"): 1}),
    "daemon/phases/rundirwatch.py": ("gap", RUN_DIR + " (its space reserve, O_NOFOLLOW|O_NONBLOCK, by path)", {
        ("make_reserve", "os.open"): 1, ("make_reserve", ".unlink"): 1, ("release_reserve", ".unlink"): 1}),
    "daemon/runfiles.py": ("gap", RUN_DIR, {("RunFiles.__init__", ".mkdir"): 1}),
    "daemon/base/runstate.py": ("gap", RUN_DIR + " (events.jsonl and supervisor.log, O_APPEND|O_CREAT by path); "
                                "/dev/null put under a lost stdout (EventLog._echo)", {
        ("EventLog.reopen", "os.open"): 1, ("EventLog.emit", "os.open"): 1, ("EventLog._echo", "os.open"): 1}),
    "daemon/base/timeline.py": ("gap", RUN_DIR + " (metrics.jsonl: the --fresh marker appended, O_NOFOLLOW|O_NONBLOCK, "
                                "a regular file only)", {("mark_fresh", "os.open"): 1}),
    "daemon/supervisor.py": ("gap", RUN_DIR, {("Supervisor._launch", ".unlink"): 1}),
    "daemon/jobs/remote_claim.py": ("private", "the remote's claim written into its own temporary directory "
                                    "(tempfile's: 0700, a random name made O_EXCL) before the store's put copies it",
                                    {("_write_new", "tempfile.TemporaryDirectory"): 1,
                                     ("_write_new", ".write_bytes"): 1}),
    # --- the trainer ------------------------------------------------------------------------------------------------
    "minilmd/compile_cache.py": ("private", PRIVATE_SCRATCH + " (the run's compile caches), a bench's own temporary "
                                 "directory (tempfile's: 0700, a random name made O_EXCL), or a directory the user set "
                                 "that place_rule.dir_problem passed, judged again once made", {
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
        ("save", "shutil.rmtree"): 2, ("_write_checkpoint", ".mkdir"): 1}),
    "trainer/loop/faults.py": ("private", "test fault injection (MINILMD_FAULT): the run's own files; the SIGBUS "
                               "page in a nameless temporary file (tempfile's, O_TMPFILE)", {
        ("FaultInjector.maybe_fire", "open"): 1, ("_sigbus", "tempfile.TemporaryFile"): 1}),
    "minilmd/metrics.py": ("gap", RUN_DIR + " (metrics.jsonl; the heartbeat by fsio.atomic_write_text)", {
        ("MetricsLog.__init__", ".mkdir"): 1, ("MetricsLog._end_torn_line", "open"): 1,
        ("MetricsLog.write", "open"): 1}),
    "trainer/loop/train.py": ("gap", RUN_DIR + "; and scratch", {("run", ".unlink"): 1}),
    "trainer/model/adapter.py": ("private", "export --out (an HF PEFT directory): " + PRIVATE_TMP + " (export_paths."
                                 "ExportCopy, in the directory of --out checked by dirfd's rule); the base's private "
                                 "copy in a fresh 0700 directory of tempfile's", {
        ("export_peft", ".write_text"): 1, ("export_peft", "safetensors.save_file"): 1,
        ("_from_copy", "tempfile.TemporaryDirectory"): 1}),
    "trainer/model/basecopy_read.py": ("private", "a private copy in a fresh 0700 directory of this user's", {
        ("private_copy", ".mkdir"): 1, ("private_copy", ".write_bytes"): 2, ("private_copy", "open"): 1}),
    "trainer/model/export.py": ("private", "export --out: " + PRIVATE_TMP + " (export_paths.ExportCopy, in the "
                                "directory of --out checked by dirfd's rule); a MiniMind .pth through its O_EXCL "
                                "file object made at the copy's descriptor", {
        ("_write_hf", ".write_text"): 1, ("_write_hf", ".write_bytes"): 1, ("_write_hf", "safetensors.save_file"): 1,
        ("write_minimind", "torch.save"): 1}),
}


def _mode(call: ast.Call, position: int) -> str | None:
    mode = call.args[position] if len(call.args) > position else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            mode = keyword.value
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return mode.value
    return None if mode is None else "?"  # a mode not spelled out: counted as a write, to be reviewed


WRITE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_TRUNC", "O_APPEND"}


class _Names:
    """What a module's names stand for: `import shutil as sh` makes sh "shutil", `from os import rename as r` makes
    r "os.rename"; and its module-level constants (flags = os.O_WRONLY | os.O_CREAT) for os.open's flags."""

    def __init__(self, module: ast.Module) -> None:
        self.aliases: dict[str, str] = {}
        for node in ast.walk(module):  # function-level imports too
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        self.constants = {target.id: node.value for node in module.body if isinstance(node, ast.Assign)
                          for target in node.targets if isinstance(target, ast.Name)}

    def qualified(self, expr: ast.expr) -> str | None:
        """The dotted name an imported module's function is called by ("os.rename"), or None for anything else
        (a method of an object, a local name); a bare name that is not imported stays itself ("open")."""
        if isinstance(expr, ast.Name):
            return self.aliases.get(expr.id, expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, (ast.Name, ast.Attribute)):
            if isinstance(expr.value, ast.Name) and expr.value.id not in self.aliases:
                return None  # a method of a local object: p.mkdir()
            base = self.qualified(expr.value)
            return f"{base}.{expr.attr}" if base else None
        return None

    def creates(self, flags: ast.expr, seen: frozenset = frozenset()) -> bool:
        """Whether os.open's flags write (WRITE_FLAGS: O_CREAT, and O_WRONLY, O_RDWR, O_TRUNC or O_APPEND, which
        write into whatever stands at the path, a planted link's target too), through the module's constants."""
        for node in ast.walk(flags):
            if isinstance(node, (ast.Name, ast.Attribute)) and (
                    node.id if isinstance(node, ast.Name) else node.attr) in WRITE_FLAGS:
                return True
            if isinstance(node, ast.Name) and node.id in self.aliases and node.id not in seen and \
                    (imported := _imported_constant(self.aliases[node.id])) is not None:
                if imported.creates(imported.constants[node.id], seen | {node.id}):
                    return True  # flags a module of the project defines (jsonlines.LOG_APPEND): followed there
            if isinstance(node, ast.Name) and node.id not in self.aliases and node.id not in seen:
                if node.id not in self.constants or self.creates(self.constants[node.id], seen | {node.id}):
                    return True  # flags in a local variable: counted as a create, to be reviewed
        return False


PACKAGE_DIRS = {"minilmd.daemon": "daemon", "minilmd.trainer": "trainer", "minilmd": "minilmd"}
"""pyproject.toml's package-dir: where a module of the project lies."""


def _imported_constant(qualified: str) -> _Names | None:
    """The names of the project module a constant is imported from (`minilmd.daemon.base.jsonlines.LOG_APPEND`),
    when that module defines it; None for anything else (os.O_CREAT, a function, another package's name)."""
    module, _, name = qualified.rpartition(".")
    for package, folder in PACKAGE_DIRS.items():
        if module == package or module.startswith(package + "."):
            path = ROOT / folder / (module[len(package) + 1:].replace(".", "/") or "__init__")
            path = path.with_suffix(".py")
            if path.is_file():
                names = _Names(source_tree.tree(path))
                return names if name in names.constants else None
            return None
    return None


def _open_flags(call: ast.Call) -> ast.expr | None:
    flags = call.args[1] if len(call.args) > 1 else None
    return next((k.value for k in call.keywords if k.arg == "flags"), flags)


def _module_kind(name: str, call: ast.Call, names: _Names) -> str | None:
    """The kind of a call of an imported module's function, by its full name, else None."""
    module, _, function = name.rpartition(".")
    if module == "os" and function == "open":
        flags = _open_flags(call)
        return "os.open" if flags is not None and names.creates(flags) else None
    if module in ("builtins", "io") and function == "open":
        return _kind_of_open(call)
    table = {"os": OS_CALLS, "shutil": SHUTIL_CALLS, "tempfile": TEMPFILE_CALLS, "numpy": NUMPY_CALLS,
             "safetensors.torch": SAFETENSORS_CALLS, "safetensors.numpy": SAFETENSORS_CALLS, "torch": TORCH_CALLS}
    if function in table.get(module, ()):
        return f"{SHORT.get(module, module)}.{function}"
    return None


def _kind_of_open(call: ast.Call) -> str | None:
    mode = _mode(call, 1)
    return "open" if mode is not None and (mode == "?" or WRITE_MODES & set(mode)) else None


def _kind(call: ast.Call, names: _Names) -> str | None:
    """What a call is when it writes by path ("os.rename", ".mkdir", "open", ...), else None."""
    if any(k.arg in FD_KEYWORDS for k in call.keywords):
        return None  # relative to a directory descriptor
    fn = call.func
    name = names.qualified(fn)
    if name == "open":
        return _kind_of_open(call)
    if name and "." in name:
        return _module_kind(name, call, names)
    if not isinstance(fn, ast.Attribute) or name:
        return None
    if fn.attr in PATH_CALLS:
        return f".{fn.attr}"
    if fn.attr in ONE_ARG_CALLS and len(call.args) == 1 and not call.keywords:
        return f".{fn.attr}"
    if fn.attr == "open":  # Path.open(mode), fs.open(path, mode): a mode spelled out
        modes = [a.value for a in [*call.args[:2], *(k.value for k in call.keywords if k.arg == "mode")]
                 if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value
                 and set(a.value) <= set("rwxab+t")]
        return "open" if any(WRITE_MODES & set(m) for m in modes) else None
    return None


class _Sites(ast.NodeVisitor):
    def __init__(self, module: ast.Module) -> None:
        self.names = _Names(module)
        self.where: list[str] = []
        self.found: Counter = Counter()
        self.visit(module)

    def _scope(self, node) -> None:
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_Call(self, node: ast.Call) -> None:
        kind = _kind(node, self.names)
        if kind:
            self.found[(".".join(self.where) or "<module>", kind)] += 1
        self.generic_visit(node)


@functools.cache
def sites() -> dict[str, Counter]:
    """{module: Counter((function, call))} of every by-path write in the project, the helper aside."""
    found = {}
    for path in source_tree.code_files(*SOURCES):
        name = path.relative_to(ROOT).as_posix()
        if name == THE_HELPER:
            continue
        visitor = _Sites(source_tree.tree(path))
        if visitor.found:
            found[name] = visitor.found
    return found


def differences(found: dict[str, Counter], reviewed: dict) -> list[str]:
    """Each (module, function, call) whose count differs from its review: a new site, or a stale review."""
    problems = []
    for module in sorted(set(found) | set(reviewed)):
        have, allowed = found.get(module, Counter()), reviewed.get(module, ("", "", {}))[2]
        for key in sorted(set(have) | set(allowed)):
            if have[key] != allowed.get(key, 0):
                problems.append(f"{module}: {key[0]}: {key[1]} x{have[key]} (reviewed: {allowed.get(key, 0)})")
    return problems


def test_every_write_by_path_is_reviewed_and_none_is_new():
    problems = differences(sites(), REVIEWED)
    assert not problems, ("by-path creates/renames/chmods/deletes whose count differs from REVIEWED "
                          "(tests/test_shared_write_audit.py): put a new one through minilmd/dirfd.py's Dir where "
                          "others may write, or add it to REVIEWED with the reason its place is private; remove a "
                          "review whose call is gone:\n  " + "\n  ".join(problems))


def test_every_review_says_why():
    for module, (place, reason, allowed) in REVIEWED.items():
        assert place in ("private", "gap") and len(reason) > 20 and allowed, module
        assert all(n > 0 for n in allowed.values()), module


PROBE = """\
import os, shutil, tempfile
import shutil as sh
import numpy as np
import safetensors.torch
from os import rename, open as os_open
from pathlib import Path
from safetensors.torch import save_file
from tempfile import mkstemp as make_temp
from minilmd.daemon.base.jsonlines import LOG_APPEND
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
        ("f", "tempfile.mkstemp"): 1})


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
