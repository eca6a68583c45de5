"""What /proc says of a process: its start time (with the pid, its identity; started_since_boot in seconds), state,
process group, uids, environment as started, the signals it catches, and of each thread the signals pending and
blocked. The one parser of /proc/PID/stat and /proc/PID/status (and of a thread's, /proc/PID/task/TID/status).

The one judge of "does the process a record names run": process_alive, by pid, start ticks and the boot the record
was written in (a record of another boot names no process of this one; a record without a boot id, an older
minilmd's, is judged by pid and start ticks as before). Every record of a process that outlives a reboot records
this boot: boot_id() in a JSON record, boot_tag() (its first 8 hex digits) in a temporary name (minilmd/names.py: a
sync's on the remote, an export's, a prepare's, a checkpoint root's in scratch), whose maker this_process and
this_maker give.

Readers only: nothing here signals. minilmd/procs.py, the one place that signals, proves a process the run's with
these (and re-exports them: its callers ask it); daemon/child/stackdump.py asks them which processes of a hung
trainer's group catch SIGUSR1, in which state each is, and whether its handler has returned (signal_masks). Linux
only. Torch-free, standard library only (and minilmd/fdread.py, its bounded read).
"""
from __future__ import annotations

import functools
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minilmd.fdread import read_past_bound
from minilmd.tmpnames import BOOT_TAG, BOOT_TAG_LEN, host_tag, remote_tmp_maker

GONE_STATES = ("Z", "X")
"""The state letters of a process that has ended (a zombie, dead): it runs nothing and can be signalled no more."""
BOOT_ID = "/proc/sys/kernel/random/boot_id"
"""A random id the kernel makes at each boot: a (pid, start ticks) recorded under another names no process of this
one, whatever runs under that pid and start time now (a service started at boot gets much the same of both)."""
_BOOT_FORM = re.compile(rf"[0-9a-f]{{8}}(?:-[0-9a-f]{{4}}){{3}}-[0-9a-f]{{12}}|{BOOT_TAG.pattern}")
"""A boot id as the kernel writes it, or a temporary name's boot tag (its first BOOT_TAG_LEN hex digits)."""
MAX_STATUS_BYTES = 64 << 10
"""The most of a /proc/PID/status read (about 1.5 KiB in practice): a longer one is not known, never cut short."""


def _read_text(path: str) -> str:
    return Path(path).read_text()


@functools.cache
def boot_id() -> str:
    """This boot's id (BOOT_ID), "" where it cannot be read (then no record is told from another boot's)."""
    try:
        with open(BOOT_ID, encoding="ascii") as f:
            return f.read(64).strip()
    except (OSError, ValueError):
        return ""


def boot_tag() -> str:
    """The first BOOT_TAG_LEN hex digits of this boot's id: what a temporary name records of its boot ("" where the
    boot id cannot be read, or is not the kernel's hex form: the name then records none)."""
    tag = boot_id()[:BOOT_TAG_LEN]
    return tag if BOOT_TAG.fullmatch(tag) else ""


def recorded_boot(value: object) -> str:
    """The boot id a JSON record holds (its "boot" field's value), "" where it holds none or no string: such a
    record is judged as an older minilmd's, by pid and start ticks."""
    return value if isinstance(value, str) else ""


def of_another_boot(recorded: str) -> bool:
    """Whether a record's boot (`recorded`: a boot id, or a name's boot_tag; "" in a record of an older minilmd) is
    another boot's than this one: the machine has restarted since it was written. A value of neither form (a boot id
    is the kernel's 8-4-4-4-12 lowercase hex, a tag its first 8 digits) says no boot, as "" does: the record is
    judged by pid and start ticks (taken for another boot's, its live process would count as gone)."""
    this = boot_id()
    if not _BOOT_FORM.fullmatch(recorded) or not this:
        return False
    return recorded != (this[:BOOT_TAG_LEN] if len(recorded) == BOOT_TAG_LEN else this)


def stat_fields(pid: int, read: Callable[[str], str] = _read_text) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (the state first: stat(5)'s field 3; the process group
    at [2], the start ticks at [19]); None only when the process is gone (no /proc entry: ENOENT, ESRCH); any other
    failure to read it (EMFILE, ENOMEM, EACCES, a torn read) raised (OSError, ValueError). `read`: the reader of
    /proc/PID/stat (the tests' seam)."""
    try:
        raw = read(f"/proc/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        return None
    rest = raw[raw.rfind(")") + 2:].split()  # the command name may contain spaces and parentheses
    if len(rest) < 20:  # a torn or foreign read: not known, said as the docstring promises (never an IndexError)
        raise ValueError(f"/proc/{pid}/stat: {len(rest)} fields after the command name, not the 20 and more expected")
    return rest


def start_ticks_or_raise(pid: int, read: Callable[[str], str] = _read_text) -> int | None:
    """process_start_ticks for a caller that must tell "gone" from "not known": None only when the process is gone
    or a zombie; any other failure to read raised, as stat_fields raises it."""
    rest = stat_fields(pid, read)
    if rest is None or rest[0] in GONE_STATES:
        return None
    return int(rest[19])


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if it is gone or a
    zombie. Together with the pid it identifies a process: a recycled pid has another start time."""
    try:
        return start_ticks_or_raise(pid)
    except (OSError, ValueError):
        return None


def process_alive(pid: int | None, start_ticks: int | None = None, boot: str = "") -> bool:
    """Whether the process a record names runs: process `pid` runs (not a zombie) and, when `start_ticks` is given,
    is the one that started then (a recycled pid has another start time), and the record was written in this boot
    (`boot`: its boot id or boot_tag; a service started at boot gets much the same pid and start ticks each boot, so
    a record of another boot names none of this one's). A record that kept no start time, or no boot (an older
    minilmd's), takes any live process of that pid, or of that pid and start time. The one judge of every record of
    a process: state.json's supervisor, trainer.json and trainer.lock, the temporary names of a sync, an export, a
    prepare."""
    if not pid or pid <= 0 or of_another_boot(boot):
        return False
    ticks = process_start_ticks(pid)
    return ticks is not None and (start_ticks is None or ticks == start_ticks)


def since_boot() -> float:
    """Seconds since this boot (CLOCK_BOOTTIME): the clock process starts are kept in (started_since_boot), which no
    wall-clock step (NTP, a VM's time sync) moves."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def started_since_boot(pid: int) -> float | None:
    """When process `pid` started, in seconds since this boot (its start ticks; rounded down to a tick, 10 ms), to
    compare with since_boot(); None if it is gone or a zombie."""
    ticks = process_start_ticks(pid)
    return None if ticks is None else ticks / os.sysconf("SC_CLK_TCK")


def this_process() -> tuple[int, int | None, str]:
    """(pid, start ticks, boot tag) of this process: what the temporary names it makes record of it (a checkpoint
    root's: tmpnames.save_tmp_name...; with the host, this_maker), so that a later clean-up tells it from a process
    given its pid since, or its pid and start time in a later boot (process_alive)."""
    return os.getpid(), process_start_ticks(os.getpid()), boot_tag()


def this_maker() -> tuple[str, int, int | None, str]:
    """(host tag, pid, start ticks, boot tag) of this process: what the temporary names it makes where other hosts
    may write record (a sync's on the remote: tmpnames.sync_tmp_name, pointer_tmp_tag; an export's, a prepare's:
    leftovers.me). The host as tmpnames.host_tag spells it: a hostname is whatever bytes sethostname was given, a `/`
    too, and a name built from it must stay one name in its directory, told from every other host's."""
    return host_tag(), *this_process()


def this_host_tags() -> tuple[str, ...]:
    """The host tags a temporary name of this host's on a remote may carry: this_maker's, and the one an older
    minilmd wrote there (every character outside `A-Za-z0-9_.` made `_`: `gpu-1` and `gpu_1` shared it), still this
    host's, so that its leftovers are cleaned up after an upgrade as before."""
    older = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
    return tuple(dict.fromkeys((host_tag(), older)))


def is_this_host(host: str) -> bool:
    """Whether a temporary name's host is this one: one of this_host_tags, or the raw hostname an older minilmd's
    export and prepare names recorded."""
    return host in (*this_host_tags(), socket.gethostname())


def this_hosts_remote_maker(name: str) -> tuple[int, int | None, str] | None:
    """tmpnames.remote_tmp_maker of a temporary name on a remote by any of this_host_tags: (pid, start ticks, boot) of
    the sync of this host that made it, for process_alive; None for another host's name, or no sync's."""
    return next((maker for tag in this_host_tags() if (maker := remote_tmp_maker(name, tag)) is not None), None)


def process_state(pid: int) -> str | None:
    """The process's state letter (R, S, D, T, t, Z, ...: proc(5)), None when it is gone or cannot be read."""
    try:
        rest = stat_fields(pid)
    except (OSError, ValueError):
        return None
    return rest[0] if rest else None


def group_members(pgid: int) -> list[int]:
    """The live processes (no zombie) of process group `pgid`, its leader first: /proc's list, read now (a process
    may end or join meanwhile: the caller proves each one again before it acts on it)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            rest = stat_fields(int(entry))
        except (OSError, ValueError):
            continue
        if rest is not None and rest[0] not in GONE_STATES and int(rest[2]) == pgid:
            members.append(int(entry))
    return sorted(members, key=lambda p: p != pgid)


def _read_status(path: str) -> str:
    """A /proc status file, read bounded (MAX_STATUS_BYTES: past it ValueError); OSError when it cannot be read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        data = read_past_bound(fd, MAX_STATUS_BYTES)
    finally:
        os.close(fd)
    if len(data) > MAX_STATUS_BYTES:
        raise ValueError(f"{path}: over {MAX_STATUS_BYTES} bytes")
    return data.decode(errors="replace")


def _status_words(path: str, keys: tuple[str, ...]) -> dict[str, list[str]] | None:
    """The words after each of `keys` ("Uid:", "SigCgt:") in a /proc status file, None when it is gone, unreadable,
    over the bound or lacks one of them."""
    try:
        lines = _read_status(path).splitlines()
    except (OSError, ValueError):
        return None
    found = {line.split(maxsplit=1)[0]: line.split()[1:] for line in lines if line.strip()}
    return {key: found[key] for key in keys} if all(key in found for key in keys) else None


def _status_line(pid: int, key: str) -> list[str] | None:
    """The words after `key` ("Uid:", "SigCgt:") in /proc/PID/status, None when it is gone, unreadable or lacks it."""
    words = _status_words(f"/proc/{pid}/status", (key,))
    return None if words is None else words[key]


def process_uids(pid: int) -> tuple[int, ...] | None:
    """(real, effective, saved, filesystem) uids of a process, from /proc/PID/status; None if it is gone."""
    try:
        words = _status_line(pid, "Uid:")
        return None if words is None else tuple(int(u) for u in words)
    except ValueError:
        return None


def catches_signal(pid: int, sig: int) -> bool:
    """Whether the process has a handler for `sig` (SigCgt of /proc/PID/status); False when it is gone or
    unreadable."""
    words = _status_line(pid, "SigCgt:")
    try:
        return bool(words and int(words[0], 16) >> (sig - 1) & 1)
    except ValueError:
        return False


@dataclass(frozen=True)
class SignalMasks:
    """One thread's signal sets, from its /proc status: pending (SigPnd, its own, or ShdPnd, the process's: sent and
    not yet taken by a handler) and blocked (SigBlk: a handler installed without SA_NODEFER, faulthandler's among
    them, runs with its own signal blocked in the thread that runs it, until it returns)."""
    pending_set: int
    blocked_set: int

    def pending(self, sig: int) -> bool:
        return bool(self.pending_set >> (sig - 1) & 1)

    def blocks(self, sig: int) -> bool:
        return bool(self.blocked_set >> (sig - 1) & 1)


def signal_masks(pid: int, tid: int | None = None) -> SignalMasks | None:
    """The signal sets of process `pid`'s thread `tid` (/proc/PID/task/TID/status; without a tid, its main thread's,
    /proc/PID/status); None when it is gone or cannot be read."""
    path = f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status"
    words = _status_words(path, ("SigPnd:", "ShdPnd:", "SigBlk:"))
    try:
        return None if words is None else SignalMasks(
            int(words["SigPnd:"][0], 16) | int(words["ShdPnd:"][0], 16), int(words["SigBlk:"][0], 16))
    except (IndexError, ValueError):
        return None


def process_environ(pid: int) -> dict[str, str]:
    """The environment a process started with ({} if unreadable: not ours, or gone). What it set later is not
    there: /proc shows the block exec gave it."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def flock_holders(st: os.stat_result, read: Callable[[str], str] = _read_text) -> list[int]:
    """Pids holding an flock on the file `st` describes (its device and inode), from /proc/locks ("1: FLOCK
    ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF", the device in hex; waiters, marked "->", skipped): for the
    words of a refusal only, never to signal. [] when /proc/locks cannot be read."""
    try:
        lines = read("/proc/locks").splitlines()
    except OSError:
        return []
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[4].isdigit() and _same_device(parts[5], device):
            pids.append(int(parts[4]))
    return pids


def flock_holders_known(st: os.stat_result, read: Callable[[str], str] = _read_text) -> list[int] | None:
    """flock_holders, None where /proc/locks cannot be read: whether anyone holds the lock cannot be told (status's
    look at a lock file it may not open, daemon/base/seen.py), never taken for "none does"."""
    try:
        table = read("/proc/locks")
    except OSError:
        return None
    return flock_holders(st, read=lambda _: table)


def _same_device(field: str, device: str) -> bool:
    """/proc/locks's "maj:min:inode" against ours: numbers compared (its hex may be padded otherwise)."""
    try:
        return [int(x, 16) for x in field.split(":")[:2]] + [int(field.rsplit(":", 1)[-1])] == \
            [int(x, 16) for x in device.split(":")[:2]] + [int(device.rsplit(":", 1)[-1])]
    except ValueError:
        return False
