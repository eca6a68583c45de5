"""A passthrough FUSE filesystem that misbehaves on request, like a flaky NFS server.

Run it in its own process (it stays in the foreground until unmounted):

    python tests/faultfs.py SOURCE MOUNTPOINT --control CONTROL_PATH [--direct-io]

Every operation on MOUNTPOINT is passed to the same path under SOURCE, unless a fault rule matches it. The rules
live in the JSON file CONTROL_PATH, which the filesystem re-reads whenever its identity (inode, mtime, size)
changes, so a test changes the behaviour of a live mount by atomically replacing that file
(`write_rules`). Each fired fault is appended as one JSON line to CONTROL_PATH + ".hits", so a test can prove
that its fault was actually exercised.

A rule is a dict: {"id": int, "op": NAME, "glob": GLOB, "action": ACTION, ...}
- op: the FUSE operation it applies to (read, write, create, rename, getattr, open, fsync, truncate, unlink,
  mkdir, readdir, ...), or "*" for all of them.
- glob: fnmatch pattern against the path relative to the mount root (no leading slash; `*` crosses `/`).
  A glob without `/` also matches the basename, so "LATEST" matches "remote/run/LATEST".
- action "error" + "errno": the operation fails with that errno (EIO on reads, ENOSPC on writes ...).
  Optional "from_offset": only reads/writes that touch bytes at or past it fail (a copy that fails mid-way;
  through the page cache, readahead may hit it up to a few hundred KiB earlier).
- action "stall" + "seconds": the operation sleeps first, then proceeds. It stops sleeping early when the rule
  disappears from the control file, so clearing the rules releases stalled callers.
- action "shrink" + "size": getattr reports at most `size` bytes and reads past it return no data, like an NFS
  client after an attribute refresh saw a truncated file. Optional "opens": N: a matching file shows so only until
  its (N+1)-th open since the rule came (an NFS client's stale cache, revalidated at an open): a transient short read
  that a fresh open of the file no longer sees.
- action "drop": rename returns success and does nothing (matched against the old or the new path).

The loop is multithreaded, so a stalled operation does not block the rest of the mount. Attribute and entry
caching in the kernel are off (timeouts 0), so a changed rule is seen by the next stat. Without --direct-io the
kernel page cache still serves re-reads within one open file, as with NFS; the test fixtures drop that cache for
the matching files when they add a read fault (opening a FUSE file invalidates its cached pages). With
--direct-io every read reaches the filesystem, but the kernel then refuses shared mappings (mmap -> ENODEV),
so np.memmap of a file on such a mount fails.
"""
from __future__ import annotations

import argparse
import errno
import fnmatch
import json
import os
import threading
import time
from pathlib import Path

ACTIONS = ("error", "stall", "shrink", "drop")
STALL_POLL_S = 0.05  # how often a stalled operation checks whether its rule was removed


# ---- the control file: shared by the filesystem and the test fixtures ----

def write_rules(control_path: str | os.PathLike, rules: list[dict]) -> None:
    """Atomically replace the rule set (a new inode, so the filesystem always notices the change)."""
    control_path = Path(control_path)
    for rule in rules:
        check_rule(rule)
    tmp = control_path.with_name(f".{control_path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps({"rules": rules}, indent=1))
    os.replace(tmp, control_path)


def read_rules(control_path: str | os.PathLike) -> list[dict]:
    """The rules in a control file; a missing or empty file means no rules."""
    try:
        text = Path(control_path).read_text()
    except FileNotFoundError:
        return []
    if not text.strip():
        return []
    rules = json.loads(text)["rules"]
    for rule in rules:
        check_rule(rule)
    return rules


def check_rule(rule: dict) -> None:
    """Raise ValueError naming what is wrong with one rule."""
    missing = [k for k in ("op", "glob", "action") if k not in rule]
    if missing:
        raise ValueError(f"fault rule {rule!r} lacks {', '.join(missing)}")
    if rule["action"] not in ACTIONS:
        raise ValueError(f"fault rule {rule!r}: action must be one of {ACTIONS}")
    need = {"error": "errno", "stall": "seconds", "shrink": "size", "drop": None}[rule["action"]]
    if need and need not in rule:
        raise ValueError(f"fault rule {rule!r}: action {rule['action']!r} needs {need!r}")


def read_hits(control_path: str | os.PathLike) -> list[dict]:
    """Every fault fired so far: [{"id", "op", "path", "action", "time"}], oldest first."""
    try:
        text = Path(str(control_path) + ".hits").read_text()
    except FileNotFoundError:
        return []
    lines = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]  # a line being appended: not yet
    return [json.loads(line) for line in lines if line.strip()]


def glob_matches(glob: str, rel_path: str) -> bool:
    """True when a rule's glob names this mount-relative path (see the module docstring)."""
    rel_path = rel_path.lstrip("/")
    if fnmatch.fnmatchcase(rel_path, glob):
        return True
    return "/" not in glob and fnmatch.fnmatchcase(os.path.basename(rel_path), glob)


class RuleBook:
    """The current rules, reloaded when the control file changes; records fired faults."""

    def __init__(self, control_path: str):
        self.control_path = control_path
        self.hits_path = control_path + ".hits"
        self._lock = threading.Lock()
        self._identity = None
        self._rules: list[dict] = []

    def rules(self) -> list[dict]:
        try:
            st = os.stat(self.control_path)
            identity = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            identity = None
        with self._lock:
            if identity != self._identity:
                try:
                    self._rules = read_rules(self.control_path) if identity else []
                    self._identity = identity
                except (ValueError, KeyError, OSError) as e:
                    # A half-written or bad control file must not take the mount down; keep the old rules.
                    print(f"faultfs: ignoring bad control file {self.control_path}: {e}", flush=True)
            return self._rules

    def matching(self, op: str, *paths: str) -> list[dict]:
        return [r for r in self.rules()
                if r["op"] in (op, "*") and any(glob_matches(r["glob"], p) for p in paths if p is not None)]

    def still_present(self, rule: dict) -> bool:
        return any(r == rule for r in self.rules())

    def record(self, rule: dict, op: str, path: str) -> None:
        line = json.dumps({"id": rule.get("id"), "op": op, "path": path.lstrip("/"),
                           "action": rule["action"], "time": time.time()})
        with self._lock, open(self.hits_path, "a") as f:
            f.write(line + "\n")


# ---- the filesystem ----

def _key(rule: dict) -> str:
    return json.dumps(rule, sort_keys=True)


def _reaches(rule: dict, span: tuple[int, int] | None) -> bool:
    """A rule with "from_offset" applies only to reads/writes that touch bytes at or past that offset."""
    start = rule.get("from_offset")
    if start is None or span is None:
        return True
    offset, size = span
    return offset + size > int(start)


class FaultFilesystem:
    """mfusepy operations: passthrough to `source`, with the faults of the rule book applied first."""

    use_ns = True  # times as integer nanoseconds (mfusepy's non-deprecated mode)

    def __init__(self, source: str, rules: RuleBook, direct_io: bool = False, squash_uid: int | None = None):
        self.source = os.path.realpath(source)
        self.rulebook = rules
        self.direct_io = direct_io
        self.squash_uid = squash_uid
        self._opens: dict[tuple[str, str], int] = {}  # (shrink rule, path) -> its opens, for a rule's "opens"
        self._opens_lock = threading.Lock()

    def _squash(self, path: str) -> None:
        """What is made here belongs to squash_uid, as an NFS server with root_squash makes root's files nobody's."""
        if self.squash_uid is not None:
            os.lchown(self._real(path), self.squash_uid, self.squash_uid)

    # -- helpers --
    def _real(self, path: str) -> str:
        return os.path.join(self.source, path.lstrip("/"))

    def _apply(self, op: str, path: str, other: str | None = None, span: tuple[int, int] | None = None):
        """Run the stall and error rules of this op; return a matching shrink/drop rule for the op to apply.

        Stalls come first, and the rules are read again after each one, so a test can hold an operation in a
        stall, add an error rule, lift the stall, and have that same operation fail ("fails mid-copy").
        `span` is the (offset, size) of a read or write, for rules limited by "from_offset".
        """
        done_stalls: set[str] = set()
        while True:
            rules = [r for r in self.rulebook.matching(op, path, other) if _reaches(r, span)]
            stall = next((r for r in rules if r["action"] == "stall" and _key(r) not in done_stalls), None)
            if stall is None:
                break
            done_stalls.add(_key(stall))
            self.rulebook.record(stall, op, path)
            deadline = time.monotonic() + float(stall["seconds"])
            while time.monotonic() < deadline and self.rulebook.still_present(stall):
                time.sleep(min(STALL_POLL_S, max(0.0, deadline - time.monotonic())))
        for rule in rules:
            if rule["action"] == "error":
                self.rulebook.record(rule, op, path)
                raise OSError(int(rule["errno"]), os.strerror(int(rule["errno"])), path)
        return next((r for r in rules if r["action"] in ("shrink", "drop")), None)

    def _shrunk_size(self, path: str) -> int | None:
        # A shrink rule is about the file, not one operation: it applies to getattr and read alike.
        rules = [r for r in self.rulebook.rules() if r["action"] == "shrink" and glob_matches(r["glob"], path)]
        with self._opens_lock:  # a rule with "opens" is over for a file opened more often than that
            rules = [r for r in rules if self._opens.get((_key(r), path), 0) <= int(r.get("opens", 1 << 62))]
        if not rules:
            return None
        rule = min(rules, key=lambda r: int(r["size"]))
        self.rulebook.record(rule, "shrink", path)
        return int(rule["size"])

    # -- lifecycle --
    def init_with_config(self, conn_info, config) -> None:
        if config is not None:
            # No attribute/entry caching: a changed rule or a dropped rename is visible to the next stat.
            config.attr_timeout = 0.0
            config.entry_timeout = 0.0
            config.negative_timeout = 0.0
            config.hard_remove = 1  # unlink really unlinks; no .fuse_hidden files in the backing dir
            config.direct_io = 1 if self.direct_io else 0
            config.kernel_cache = 0
            config.auto_cache = 0

    # -- metadata --
    def getattr(self, path, fh=None):
        self._apply("getattr", path)
        st = os.fstat(fh) if fh is not None else os.lstat(self._real(path))
        attrs = {key: getattr(st, key) for key in
                 ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino", "st_blocks", "st_blksize")}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        shrunk = self._shrunk_size(path)
        if shrunk is not None and shrunk < st.st_size:
            attrs["st_size"] = shrunk
        return attrs

    def access(self, path, amode):
        self._apply("access", path)
        if not os.access(self._real(path), amode):
            raise OSError(errno.EACCES, "access denied", path)
        return 0

    def readdir(self, path, fh):
        self._apply("readdir", path)
        return [".", ".."] + os.listdir(self._real(path))

    def readlink(self, path):
        self._apply("readlink", path)
        return os.readlink(self._real(path))

    def statfs(self, path):
        self._apply("statfs", path)
        st = os.statvfs(self._real(path))
        return {key: getattr(st, key) for key in
                ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag",
                 "f_frsize", "f_namemax")}

    def chmod(self, path, mode):
        self._apply("chmod", path)
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path, uid, gid):
        self._apply("chown", path)
        os.lchown(self._real(path), uid, gid)
        return 0

    def utimens(self, path, times=None):
        self._apply("utimens", path)
        if times is None:
            os.utime(self._real(path), follow_symlinks=False)
        else:
            os.utime(self._real(path), ns=(int(times[0]), int(times[1])), follow_symlinks=False)
        return 0

    # -- namespace --
    def mkdir(self, path, mode):
        self._apply("mkdir", path)
        os.mkdir(self._real(path), mode)
        self._squash(path)
        return 0

    def rmdir(self, path):
        self._apply("rmdir", path)
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path):
        self._apply("unlink", path)
        os.unlink(self._real(path))
        return 0

    def mknod(self, path, mode, dev):
        self._apply("mknod", path)
        os.mknod(self._real(path), mode, dev)
        return 0

    def symlink(self, target, source):
        self._apply("symlink", target)
        os.symlink(source, self._real(target))
        return 0

    def link(self, target, source):
        self._apply("link", target)
        os.link(self._real(source), self._real(target))
        return 0

    def rename(self, old, new):
        rule = self._apply("rename", old, new)
        if rule is not None and rule["action"] == "drop":
            self.rulebook.record(rule, "rename", old)
            return 0
        os.rename(self._real(old), self._real(new))
        return 0

    # -- data --
    def open(self, path, flags):
        self._apply("open", path)
        with self._opens_lock:
            for rule in self.rulebook.rules():
                if rule["action"] == "shrink" and "opens" in rule and glob_matches(rule["glob"], path):
                    self._opens[(_key(rule), path)] = self._opens.get((_key(rule), path), 0) + 1
        return os.open(self._real(path), flags)

    def create(self, path, mode, flags):
        self._apply("create", path)
        fd = os.open(self._real(path), flags | os.O_CREAT, mode)
        self._squash(path)
        return fd

    def read(self, path, size, offset, fh):
        self._apply("read", path, span=(offset, size))
        shrunk = self._shrunk_size(path)
        if shrunk is not None:
            size = max(0, min(size, shrunk - offset))
            if size == 0:
                return b""
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        self._apply("write", path, span=(offset, len(data)))
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        self._apply("truncate", path)
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._real(path), length)
        return 0

    def flush(self, path, fh):
        self._apply("flush", path)
        return 0

    def fsync(self, path, datasync, fh):
        self._apply("fsync", path)
        (os.fdatasync if datasync else os.fsync)(fh)
        return 0

    def release(self, path, fh):
        os.close(fh)
        return 0

    def fallocate(self, path, mode, offset, size, fh):
        self._apply("fallocate", path)
        if mode:
            raise OSError(errno.EOPNOTSUPP, "only plain fallocate is supported", path)
        os.posix_fallocate(fh, offset, size)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="the real directory that the mount passes through to")
    parser.add_argument("mountpoint")
    parser.add_argument("--control", required=True, help="JSON rule file, re-read when it changes")
    parser.add_argument("--direct-io", action="store_true",
                        help="bypass the kernel page cache (every read reaches the filesystem; no shared mmap)")
    parser.add_argument("--squash-uid", type=int, help="what is made belongs to this uid (NFS root_squash)")
    parser.add_argument("--debug", action="store_true", help="libfuse debug output")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.source):
        parser.error(f"source {args.source!r} is not a directory")
    if not os.path.isdir(args.mountpoint):
        parser.error(f"mount point {args.mountpoint!r} is not a directory")

    import mfusepy  # lazily: the fixtures import this module for the rule helpers on machines without libfuse

    operations = FaultFilesystem(args.source, RuleBook(os.path.abspath(args.control)), direct_io=args.direct_io,
                                 squash_uid=args.squash_uid)
    # Caching, direct_io and hard_remove are set in init_with_config (libfuse 3 keeps them in fuse_config).
    mfusepy.FUSE(operations, args.mountpoint, foreground=True, nothreads=False, debug=args.debug, fsname="faultfs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
