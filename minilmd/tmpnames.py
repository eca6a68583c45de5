"""The names of what is in progress: a save, a fetch, a sync's copy, a prune, an export, a prepare, a temp file that
replaces another whole. Each says which process made it (on a shared remote or --out its host too; its pid, start
ticks and boot), and its reader here gives that maker back, so that a clean-up removes only a name whose maker is
gone (minilmd/proc_info.py process_alive, minilmd/leftovers.py). Every temporary name starts with a dot
(names.TMP_PREFIX, or `.<out>.`), so that no reader that lists step directories or corpus files sees one.
Torch-free; at import, `re` and minilmd/names.py only.
"""
from __future__ import annotations

import re

from minilmd.names import BEST, LATEST, REMOTE_OWNER, TMP_PREFIX, step_name

BOOT_TAG_LEN = 8
"""The hex digits of the boot id a temporary name records: names stay short; two boots of one host share them once in
some 4 billion, a record of the other then judged by pid and start ticks alone, as one without a boot is."""
BOOT_TAG = re.compile(rf"[0-9a-f]{{{BOOT_TAG_LEN}}}")
"""A boot as a temporary name records it: proc_info.boot_tag, the first BOOT_TAG_LEN hex digits of the boot id."""
_BOOT_PART = rf"(?:-boot({BOOT_TAG.pattern}))?"
"""The boot after a maker's pid and start ticks in a temporary name (`-boot<boot tag>`; absent in an older
minilmd's names): a word before it, so that no older name, which ends in a number, reads as one of these and back."""
_TMP_DIR = re.compile(rf"\.tmp-.*-([0-9]+)(?:-([0-9]+)-boot({BOOT_TAG.pattern}))?")  # root_tmp_maker's


def _checked_boot(boot: str) -> str:
    """`boot` as a temporary name records it: a boot tag (proc_info.boot_tag) or "" (none); ValueError otherwise."""
    if boot and not BOOT_TAG.fullmatch(boot):
        raise ValueError(f"a boot tag is {BOOT_TAG.pattern}, not {boot!r}")
    return boot


def _root_maker(pid: int, ticks: int | None, boot: str) -> str:
    """`<pid>-<start ticks>-boot<boot tag>`: the process that made a checkpoint root's temporary name (a root's writers
    are this host's: no host), told from a later process of its pid or of a later boot (scratch on a local disk
    outlives a reboot). `<pid>` alone, the older form, where either cannot be read."""
    return f"{pid}-{ticks}-boot{boot}" if _checked_boot(boot) and ticks is not None else f"{pid}"


def save_tmp_name(step: int, pid: int, ticks: int | None = None, boot: str = "") -> str:
    """`.tmp-step-00001234-<pid>-<start ticks>-boot<boot tag>`: a save in progress (removed by the next trainer once
    its maker is gone: root_tmp_maker)."""
    return f"{TMP_PREFIX}{step_name(step)}-{_root_maker(pid, ticks, boot)}"


def fetch_tmp_name(name: str, pid: int, ticks: int | None = None, boot: str = "") -> str:
    """A download of checkpoint `name` from the remote into scratch, in progress."""
    return f"{TMP_PREFIX}{name}-fetch-{_root_maker(pid, ticks, boot)}"


def _maker(host: str, pid: int, ticks: int | None, boot: str = "") -> str:
    """`<host>-<pid>-<start ticks>-boot<boot tag>`: the process that made a temporary name (a sync's on the remote, an
    export's, a prepare's), its boot's tag (proc_info.boot_tag: a record of another boot names no process of this
    one, proc_info.process_alive). The older forms, which the clean-ups still read: `<host>-<pid>-<start ticks>`
    (boot ""), and on the remote `<host>-<pid>` (ticks None)."""
    return (f"{host}-{pid}" if ticks is None else f"{host}-{pid}-{ticks}") + (_checked_boot(boot) and f"-boot{boot}")


def sync_tmp_name(name: str, host: str, pid: int, ticks: int | None = None, boot: str = "") -> str:
    """`.tmp-step-00001234-<host>-<pid>-<start ticks>-boot<boot tag>`: a copy to the remote in progress (the host: the
    remote is shared; the start time and the boot: the next sync tells its maker from a process that got its pid
    since, or got the same pid and start time in a later boot, as an export's name does). Without `boot`, or
    `ticks`: an older minilmd's forms."""
    return f"{TMP_PREFIX}{name}-{_maker(host, pid, ticks, boot)}"


def remote_tmp_maker(name: str, host: str) -> tuple[int, int | None, str] | None:
    """(pid, start ticks, boot tag) of this host's sync that made a temporary name on the remote (a checkpoint's or
    the LoRA base's copy, sync_tmp_name, or a pointer's or the claim's temp file, pointer_tmp_tag), for
    proc_info.process_alive; ticks None, boot "" for an older minilmd's name that records none; None for any other
    name: another host's, or no sync's. The forms are not taken for each other: a random end (Dir.write_atomic's,
    fresh_tmp_name's) holds no `-` and ends in `.tmp`, a boot tag follows `boot`."""
    copy = rf"{re.escape(TMP_PREFIX)}(?:step-[0-9]{{8,}}|init)-"
    files = "|".join(re.escape(n) for n in (LATEST, BEST, REMOTE_OWNER))  # a pointer's, the claim's (put_new)
    m = re.fullmatch(rf"(?:{copy}|\.(?:{files})\.){re.escape(host)}-([0-9]+)(?:-([0-9]+))??{_BOOT_PART}"
                     rf"(?:-\w+\.tmp)?", name)
    return (int(m[1]), None if m[2] is None else int(m[2]), m[3] or "") if m else None


def remote_tmp_owner(name: str, host: str) -> int | None:
    """The pid of remote_tmp_maker's maker, None for a name no sync of this host made."""
    maker = remote_tmp_maker(name, host)
    return maker[0] if maker else None


def host_tag(hostname: str | None = None) -> str:
    """This machine's name (or `hostname`) as a temporary name where other hosts may write records it: a byte outside
    `A-Za-z0-9.` as `_` and its two hex digits (`gpu-1`: `gpu_2d1`, `gpu_1`: `gpu_5f1`), one to one, so that no two
    hosts share a tag (a clean-up judges its own host's names by pid), and no tag holds the `-` that ends it there."""
    import socket

    raw = (socket.gethostname() if hostname is None else hostname).encode("utf-8", "surrogateescape")
    return re.sub(rb"[^A-Za-z0-9.]", lambda m: b"_%02x" % m[0][0], raw).decode("ascii") or "_"


def pointer_tmp_tag(host: str, pid: int, ticks: int | None = None, boot: str = "") -> str:
    """What a sync puts into the temp file that replaces a remote LATEST or BEST: `.LATEST.<host>-<pid>-<start
    ticks>-boot<boot tag>-...` (an older minilmd's: without `-boot<boot tag>`, or `.LATEST.<host>-<pid>-...`)."""
    return f"{_maker(host, pid, ticks, boot)}-"


def deleting_name(name: str, pid: int, ticks: int | None = None, boot: str = "") -> str:
    """A checkpoint being pruned: renamed first, so that no reader sees a half-deleted one with its manifest."""
    return f"{TMP_PREFIX}deleting-{name}-{_root_maker(pid, ticks, boot)}"


def replaced_name(name: str, pid: int, ticks: int | None = None, boot: str = "") -> str:
    """A directory moved aside by fsio.publish_dir to make room for its new version, removed right after."""
    return f"{TMP_PREFIX}replaced-{name}-{_root_maker(pid, ticks, boot)}"


def atomic_tmp_prefix(name: str) -> str:
    """`.LATEST.` for LATEST: the start of every temporary file that replaces `name` whole or is renamed onto it
    (fsio.atomic_write_text, dirfd.Dir.replacing and write_atomic, a remote's Publisher, remote_write's claim probe);
    a remote's end in a `tag` (pointer_tmp_tag) and random characters, `.tmp` (remote_tmp_owner reads them back)."""
    return f".{name}."


def lock_guard_name(name: str) -> str:
    """`.supervisor.lock.guard` for supervisor.lock: the file whose flock a replacement of the lock file `name` holds
    (minilmd/lockfile.py `guarded`), removed by its maker after."""
    return f"{atomic_tmp_prefix(name)}guard"


def aside_name(tmp_name: str) -> str:
    """`<tmp_name>.old`: what a publish (dirpublish.publish, on NFS) sets aside beside the temporary directory
    `tmp_name` it renames into place (a prepare's, an export's): its maker's matcher (prepare_tmp_maker,
    export_tmp_maker) knows it by the temporary name it extends."""
    return f"{tmp_name}.old"


def fresh_tmp_name(tmp_name: str, token: str) -> str:
    """`<tmp_name>-<token>.tmp`: a remote's temporary directory made under a fresh name beside `tmp_name`, which
    something it did not make holds (remote_local: remote_tmp_owner still knows it as this host's sync's)."""
    return f"{tmp_name}-{token}.tmp"


def part_name(name: str) -> str:
    """`<name>.part`: a staged corpus file while it is copied into scratch, renamed to `name` once whole."""
    return f"{name}.part"


def root_tmp_maker(name: str) -> tuple[int, int | None, str] | None:
    """(pid, start ticks, boot tag) of the process that made a checkpoint root's temporary name (`.tmp-...-<pid>-<start
    ticks>-boot<boot tag>`: save_tmp_name, fetch_tmp_name, deleting_name, replaced_name), for
    proc_info.process_alive; ticks None, boot "" for a name that records only the pid (an older minilmd's); None for
    other names."""
    m = _TMP_DIR.fullmatch(name)
    return (int(m[1]), None if m[2] is None else int(m[2]), m[3] or "") if m else None


def prepare_tmp_name(out_name: str, host: str, pid: int, start_ticks: int, boot: str = "") -> str:
    """`.<out>.prepare-<host>-<pid>-<start ticks>-boot<boot tag>` beside the output directory: a prepare in progress.
    The name says which process made it, as an export's does (export_tmp_name), so that the next prepare removes it
    only once that process is gone, a recycled pid told by its start time, a later boot's process by the boot. Not
    `.<out>.tmp-...`: that is an export's to the same path, which a prepare must never take for its own."""
    return f".{out_name}.prepare-{_maker(host, pid, start_ticks, boot)}"


def prepare_tmp_maker(out_name: str, name: str) -> tuple[str | None, int, int | None, str] | None:
    """(host, pid, start ticks, boot tag) of the prepare that made `name` for output `out_name`: a prepare_tmp_name
    (with or without the random suffix minilmd/dirfd.py's make_temp adds; ticks None for a recorded 0, as
    export_tmp_maker), the aside_name of one (`prepare --force`'s older output set aside), an older minilmd's without
    the boot (boot ""), or its `.<out>.tmp-<pid>` and `.<out>.tmp-old-<pid>` (host and start time None, boot "": they
    record none). None for any other name, an export's `.<out>.tmp-<host>-<pid>-<ticks>` too."""
    out = re.escape(f".{out_name}.")
    if m := re.fullmatch(rf"{out}prepare-(.+)-(\d+)-(\d+){_BOOT_PART}(?:\.[0-9a-f]{{8}})?(?:\.old)?", name):
        return m.group(1), int(m.group(2)), int(m.group(3)) or None, m.group(4) or ""
    if m := re.fullmatch(rf"{out}tmp-(?:old-)?(\d+)", name):
        return None, int(m.group(1)), None, ""
    return None


def export_tmp_name(out_name: str, host: str, pid: int, start_ticks: int, boot: str = "") -> str:
    """`.<out>.tmp-<host>-<pid>-<start ticks>-boot<boot tag>` beside an export's output file or directory, renamed into
    place when complete. The name says which process made it: the next export to <out> removes it once that process
    is gone (a SIGKILL leaves it), and tells a recycled pid by its start time, a process of a later boot by the boot
    (minilmd/proc_info.py process_alive). The host: --out may be on a file system other hosts write too, where this
    host's pids say nothing."""
    return f".{out_name}.tmp-{_maker(host, pid, start_ticks, boot)}"


def export_tmp_maker(out_name: str, name: str) -> tuple[str, int, int | None, str] | None:
    """(host, pid, start ticks, boot tag) of the export that made the export_tmp_name `name` for output `out_name`
    (with or without the random suffix minilmd/dirfd.py's make_temp adds), or the aside_name of one (what
    dirpublish.publish sets aside on NFS); ticks None for a recorded 0 (its maker could not read its start time:
    leftovers.me), boot "" for an older minilmd's name without one; None for any other name."""
    m = re.fullmatch(rf"{re.escape(f'.{out_name}.tmp-')}(.+)-(\d+)-(\d+){_BOOT_PART}(?:\.[0-9a-f]{{8}})?(?:\.old)?",
                     name)
    return (m.group(1), int(m.group(2)), int(m.group(3)) or None, m.group(4) or "") if m else None


def old_export_tmp_name(out_name: str) -> str:
    """`.<out>.tmp`: an export's temporary name before it named its process; whose it is cannot be told."""
    return f".{out_name}.tmp"
