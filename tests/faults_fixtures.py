"""Root-only fault fixtures: a misbehaving FUSE mount, a small tmpfs, a memory cgroup that really OOM-kills.

Use them from any test module with

    from faults_fixtures import faultfs, small_tmpfs, memory_cgroup

- `faultfs`: a FaultMount over a fresh tmp dir (tests/faultfs.py in its own process). `.root` is the mount point,
  `.backing` the real directory behind it; control methods add faults by glob (relative to the mount root):
  fail_reads, fail_writes, stall, shrink, enospc, drop_rename, clear; `.hits()` lists the faults that fired.
- `small_tmpfs`: a function `make(size) -> Path` mounting a tmpfs of that size (bytes or "1m"); all unmounted after.
- `memory_cgroup`: a function `make(limit_bytes) -> MemoryCgroup` (cgroup v1 memory under /sys/fs/cgroup/memory);
  the cgroup is callable with a pid to put it in, offers `preexec_fn` for Popen, and reads OOM-kill counters.

Failing an operation that is already under way (a copy that breaks mid-way): `sid = fs.stall(glob, 300)`, wait
until `fs.hits("stall")`, add `fs.fail_reads(glob)`, then `fs.remove(sid)`: the held read resumes and fails.
Or `fs.fail_reads(glob, from_offset=n)` for a file that reads fine up to about n bytes.

Each fixture skips with the reason when the machine lacks what it needs (root, /dev/fuse, fusermount3, libfuse3,
cgroup v1 memory). Nothing is left mounted or created after a test, even a failed one. `mounted_faultfs` and
`unavailable_*` are public for scripts outside pytest (the soak).
"""
from __future__ import annotations

import contextlib
import ctypes.util
import errno as errno_mod
import gc
import importlib.util
import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from faultfs import glob_matches, read_hits, write_rules
from minilmd import mounts

FAULTFS_SCRIPT = Path(__file__).with_name("faultfs.py")
CGROUP_MEMORY_ROOT = Path("/sys/fs/cgroup/memory")
MOUNT_TIMEOUT_S = 120.0


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = size.strip().lower()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


# ---- FUSE ----

def _invalidate(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def unavailable_fuse() -> str | None:
    """Why a faultfs mount cannot work here, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "faultfs needs /dev/fuse (no FUSE kernel module here)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return f"faultfs needs root or read/write access to /dev/fuse (euid {os.geteuid()})"
    if shutil.which("fusermount3") is None:
        return "faultfs needs fusermount3 (apt-get install fuse3)"
    if not ctypes.util.find_library("fuse3") and not ctypes.util.find_library("fuse"):
        return "faultfs needs libfuse3.so.3 (apt-get install libfuse3-3)"
    if importlib.util.find_spec("mfusepy") is None:
        return "faultfs needs the python package mfusepy (the test extra of pyproject.toml)"
    return None


def is_mounted(path: str | os.PathLike) -> bool:
    """True when something is mounted at path, even a dead FUSE mount (where os.path.ismount says False,
    because its stat fails with ENOTCONN)."""
    path = os.path.realpath(path)
    return any(m.point == path for m in mounts.read_mounts())


def unmount(mountpoint: str | os.PathLike) -> None:
    """Unmount a FUSE mount, live or dead; lazily when it is busy. Raises when it stays mounted. Busy, it is tried
    again after a garbage collection first: an object of the test left in a reference cycle (an in-process Syncer)
    still held a directory descriptor there, and a lazy unmount leaves the filesystem process waiting for it (2 s
    of FaultMount.unmount's wait each time)."""
    mountpoint = str(mountpoint)
    if not is_mounted(mountpoint):
        return
    done = _run(["fusermount3", "-u", mountpoint])
    if done.returncode != 0 and is_mounted(mountpoint):
        gc.collect()
        done = _run(["fusermount3", "-u", mountpoint])
    if done.returncode != 0 and is_mounted(mountpoint):
        done = _run(["fusermount3", "-u", "-z", mountpoint])
    if is_mounted(mountpoint):
        raise RuntimeError(f"could not unmount {mountpoint}: {done.stderr.strip()}")


class FaultMount:
    """A live faultfs mount and its control file. Methods return the id of the rule they add."""

    def __init__(self, backing: Path, root: Path, control: Path, proc: subprocess.Popen, log_path: Path):
        self.backing = backing
        self.root = root
        self.control = control
        self.proc = proc
        self.log_path = log_path
        self._rules: list[dict] = []
        self._ids = itertools.count(1)

    # -- faults --
    def fail_reads(self, path_glob: str, errno: int = errno_mod.EIO, from_offset: int | None = None) -> int:
        """Reads fail with errno; with from_offset only those touching bytes at or past it (mid-file)."""
        extra = {} if from_offset is None else {"from_offset": int(from_offset)}
        return self.add_rule("read", path_glob, "error", errno=errno, **extra)

    def fail_writes(self, path_glob: str, errno: int = errno_mod.EIO, from_offset: int | None = None) -> int:
        """Writes fail with errno; with from_offset only those reaching bytes at or past it."""
        extra = {} if from_offset is None else {"from_offset": int(from_offset)}
        return self.add_rule("write", path_glob, "error", errno=errno, **extra)

    def stall(self, path_glob: str, seconds: float, op: str = "read") -> int:
        return self.add_rule(op, path_glob, "stall", seconds=float(seconds))

    def shrink(self, path_glob: str, report_size: int, opens: int | None = None) -> int:
        """Matching files show `report_size` bytes at most; with `opens`, only until a file's (opens+1)-th open
        (a stale cache that a fresh open revalidates)."""
        extra = {} if opens is None else {"opens": int(opens)}
        return self.add_rule("*", path_glob, "shrink", size=int(report_size), **extra)

    def enospc(self, path_glob: str) -> list[int]:
        """ENOSPC on writes to matching files and on creating them (files or directories)."""
        return [self.add_rule(op, path_glob, "error", errno=errno_mod.ENOSPC) for op in ("write", "create", "mkdir")]

    def drop_rename(self, path_glob: str) -> int:
        """Renames whose old or new path matches report success and do nothing."""
        return self.add_rule("rename", path_glob, "drop")

    def add_rule(self, op: str, path_glob: str, action: str, **params) -> int:
        rule = {"id": next(self._ids), "op": op, "glob": path_glob.lstrip("/"), "action": action, **params}
        self._rules.append(rule)
        write_rules(self.control, self._rules)
        if op in ("read", "*") and "opens" not in params:  # its opens would count: the next open drops it anyway
            self._drop_page_cache(path_glob)
        return rule["id"]

    def remove(self, rule_id: int) -> None:
        self._rules = [r for r in self._rules if r["id"] != rule_id]
        write_rules(self.control, self._rules)

    def clear(self) -> None:
        """Remove every fault; stalled operations return promptly."""
        self._rules = []
        write_rules(self.control, self._rules)

    def hits(self, action: str | None = None, op: str | None = None) -> list[dict]:
        """Faults that fired so far, optionally of one action/op."""
        return [h for h in read_hits(self.control)
                if (action is None or h["action"] == action) and (op is None or h["op"] == op)]

    def _drop_page_cache(self, path_glob: str) -> None:
        # Reads that the kernel page cache can answer never reach the filesystem; opening a FUSE file (without
        # keep_cache) invalidates its cached pages, so the next read, or page fault of a mapping, sees the fault.
        if any(r["action"] in ("stall", "error") and r["op"] in ("open", "getattr", "*") for r in self._rules):
            return  # opening would stall or fail; those rules already stop reads before the cache is used
        stalls = [r["glob"] for r in self._rules if r["action"] == "stall"]
        paths = []
        for dirpath, _dirs, files in os.walk(self.backing):
            for name in files:
                rel = os.path.relpath(os.path.join(dirpath, name), self.backing)
                # Invalidating waits for the page lock that a stalled read holds: skip files that may stall.
                if glob_matches(path_glob.lstrip("/"), rel) and not any(glob_matches(g, rel) for g in stalls):
                    paths.append(self.root / rel)
        # In a thread: should it still wait on a page lock, the caller goes on after a moment.
        worker = threading.Thread(target=_invalidate, args=(paths,), daemon=True)
        worker.start()
        worker.join(timeout=5)

    # -- lifecycle --
    def alive(self) -> bool:
        return self.proc.poll() is None and os.path.ismount(self.root)

    def unmount(self) -> None:
        """Release stalls, unmount, end the filesystem process. Safe to call twice."""
        with contextlib.suppress(OSError):
            self.clear()
        try:
            unmount(self.root)
        finally:
            if self.proc.poll() is None:
                try:
                    # Unmounted cleanly it exits at once; lazily unmounted it waits for open files: end it.
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self.proc.terminate()
                    try:
                        self.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()
                        self.proc.wait()
            # A filesystem process that died leaves a dead mount ("transport endpoint is not connected").
            unmount(self.root)


@contextlib.contextmanager
def mounted_faultfs(backing: str | os.PathLike, mountpoint: str | os.PathLike, direct_io: bool = False,
                    squash_uid: int | None = None):
    """Mount faultfs over `backing` at `mountpoint` (both existing dirs) for the duration of the block; with
    squash_uid, what is made there belongs to that uid (an NFS server's root_squash)."""
    reason = unavailable_fuse()
    if reason:
        raise RuntimeError(reason)
    backing, mountpoint = Path(backing).resolve(), Path(mountpoint).resolve()
    control = mountpoint.parent / f"{mountpoint.name}.faultfs.json"
    log_path = mountpoint.parent / f"{mountpoint.name}.faultfs.log"
    write_rules(control, [])
    cmd = [sys.executable, str(FAULTFS_SCRIPT), str(backing), str(mountpoint), "--control", str(control)]
    if direct_io:
        cmd.append("--direct-io")
    if squash_uid is not None:
        cmd += ["--squash-uid", str(squash_uid)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # a Ctrl-C of the test run must not kill it mid-op
    mount = FaultMount(backing, mountpoint, control, proc, log_path)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(mountpoint):
            if proc.poll() is not None:
                raise RuntimeError(f"faultfs exited with status {proc.returncode} before mounting "
                                   f"{mountpoint}: {log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"faultfs did not mount {mountpoint} within {MOUNT_TIMEOUT_S:.0f} s: "
                                   f"{log_path.read_text()[-2000:]}")
            time.sleep(0.02)
        yield mount
    finally:
        mount.unmount()


def faultfs_dirs(tmp_path: Path) -> tuple[Path, Path]:
    """(backing, mount point): two fresh empty directories under tmp_path for mounted_faultfs; the test skipped
    where FUSE is unavailable."""
    reason = unavailable_fuse()
    if reason:
        pytest.skip(reason)
    backing, root = tmp_path / "faultfs-backing", tmp_path / "faultfs-mnt"
    backing.mkdir()
    root.mkdir()
    return backing, root


@pytest.fixture
def faultfs(tmp_path):
    """A FaultMount passing through to a fresh tmp dir (page cache on, like NFS; mmap works)."""
    backing, root = faultfs_dirs(tmp_path)
    with mounted_faultfs(backing, root) as mount:
        yield mount


# ---- tmpfs ----

def unavailable_mount() -> str | None:
    if os.geteuid() != 0:
        return f"needs root to mount a tmpfs (euid {os.geteuid()})"
    return None


@pytest.fixture
def small_tmpfs(tmp_path):
    """A function make(size, options) -> Path: a fresh tmpfs of that size (int bytes or '1m') and mount options
    ("mode=0755" unless given: "nr_inodes=8,mode=1777" for a /dev/shm with few inodes), unmounted after the test."""
    reason = unavailable_mount()
    if reason:
        pytest.skip(reason)
    mounted: list[Path] = []
    counter = itertools.count()

    def make(size: int | str, options: str = "mode=0755") -> Path:
        where = tmp_path / f"small-tmpfs-{next(counter)}"
        where.mkdir()
        done = _run(["mount", "-t", "tmpfs", "-o", f"size={_parse_size(size)},{options}", "tmpfs", str(where)])
        if done.returncode != 0:
            if "permission denied" in done.stderr.lower() or "not permitted" in done.stderr.lower():
                pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
            raise RuntimeError(f"mount -t tmpfs size={size} {where} failed: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield make
    problems = []
    for where in reversed(mounted):
        done = _run(["umount", str(where)])
        if done.returncode != 0:
            done = _run(["umount", "-l", str(where)])
        if is_mounted(where):
            problems.append(f"{where}: {done.stderr.strip()}")
    assert not problems, f"tmpfs left mounted: {problems}"


# ---- memory cgroup (v1) ----

def unavailable_memory_cgroup() -> str | None:
    """Why a cgroup v1 memory controller is not usable here (after trying to mount it), or None."""
    if os.geteuid() != 0:
        return f"needs root to create a memory cgroup (euid {os.geteuid()})"
    if not (CGROUP_MEMORY_ROOT / "memory.limit_in_bytes").exists():
        with contextlib.suppress(OSError):
            CGROUP_MEMORY_ROOT.mkdir(parents=True, exist_ok=True)
        done = _run(["mount", "-t", "cgroup", "-o", "memory", "cgroup", str(CGROUP_MEMORY_ROOT)])
        if not (CGROUP_MEMORY_ROOT / "memory.limit_in_bytes").exists():
            return (f"cgroup v1 memory controller not mounted at {CGROUP_MEMORY_ROOT} and mounting it failed: "
                    f"{done.stderr.strip() or 'no memory.limit_in_bytes'}")
    return None


def _swap_total_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("SwapTotal:"):
                return int(line.split()[1])
    return 0


class MemoryCgroup:
    """One cgroup v1 memory group with a hard limit. Call it with a pid to move that process in."""

    def __init__(self, path: Path, limit_bytes: int):
        self.path = path
        self.limit_bytes = limit_bytes
        self.memsw_limited = False  # memory+swap limited as well (machines with swap)

    def _write(self, name: str, value) -> None:
        (self.path / name).write_text(f"{value}\n")

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", pid)

    __call__ = add

    def preexec_fn(self) -> None:
        """For subprocess.Popen(preexec_fn=cg.preexec_fn): the child joins before it execs and allocates."""
        self._write("cgroup.procs", 0)  # 0 = the writing process

    def pids(self) -> list[int]:
        return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]

    def oom_control(self) -> dict[str, int]:
        """memory.oom_control as a dict: oom_kill_disable, under_oom, oom_kill (kernel >= 4.13)."""
        pairs = (line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
        return {key: int(value) for key, value in pairs}

    def oom_kills(self) -> int:
        return self.oom_control().get("oom_kill", 0)

    def failcnt(self) -> int:
        """Times a charge hit the limit: memory.failcnt plus memory.memsw.failcnt (with memsw accounting on,
        the kernel charges memory+swap first, so a hit may be counted only there)."""
        names = ("memory.failcnt", "memory.memsw.failcnt")
        return sum(int((self.path / name).read_text()) for name in names if (self.path / name).exists())

    def max_usage(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def remove(self) -> None:
        """Move any process still inside to the parent group (never kill it), then delete the group."""
        parent_procs = self.path.parent / "cgroup.procs"
        for _ in range(600):  # up to 60 s: on a loaded machine a process inside may take long to leave
            if not self.path.exists():
                return
            for pid in self.pids():
                with contextlib.suppress(OSError):  # it may have exited meanwhile
                    parent_procs.write_text(f"{pid}\n")
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"could not remove memory cgroup {self.path}: processes {self.pids()}")


@pytest.fixture
def memory_cgroup():
    """A function make(limit_bytes) -> MemoryCgroup (swap off inside it); the groups are removed after."""
    reason = unavailable_memory_cgroup()
    if reason:
        pytest.skip(reason)
    made: list[MemoryCgroup] = []
    counter = itertools.count()

    def make(limit_bytes: int | str) -> MemoryCgroup:
        limit = _parse_size(limit_bytes)
        path = CGROUP_MEMORY_ROOT / f"minilmd-test-{os.getpid()}-{next(counter)}"
        path.mkdir()
        group = MemoryCgroup(path, limit)
        made.append(group)
        group._write("memory.limit_in_bytes", limit)
        # With swap on, the kernel may swap the child instead of killing it; limit memory+swap too then. Only
        # then: a memsw limit makes this kernel (6.18) stop counting memory.failcnt.
        if _swap_total_kib() > 0 and (path / "memory.memsw.limit_in_bytes").exists():
            group._write("memory.memsw.limit_in_bytes", limit)
            group.memsw_limited = True
        with contextlib.suppress(OSError):
            group._write("memory.swappiness", 0)
        return group

    yield make
    for group in reversed(made):
        group.remove()


__all__ = ["faultfs", "small_tmpfs", "memory_cgroup", "FaultMount", "MemoryCgroup", "mounted_faultfs",
           "unavailable_fuse", "unavailable_mount", "unavailable_memory_cgroup", "unmount", "is_mounted"]
