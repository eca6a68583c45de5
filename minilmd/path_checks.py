"""What a mistyped path looks like, told from a share gone or not mounted, for the config checks (minilmd/probes.py
path_problems): a path that is not there while the directory above it holds other entries is a typo at a first
launch (minilmd/shared_place.py gone_or_typo), refused, exit 2, rather than waited for without end; an absence an
unmounted share explains is waited for. Here: the [eval] probe, the Prometheus textfile's directory (never made by
the run), the corpus of a run that has started before but whose scratch holds no staged copy to train from, a
run.remote in a view of the kernel (/proc), below missing directories the sync must not make (from the top level or
a mount parent, below an unmounted share's stub) or on a configured mount point nothing is mounted on now, and
whether a path can be written at all. Torch-free.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from minilmd import mount_places, mounts, scratch_root
from minilmd.bounded import bounded_probe
from minilmd.config import ConfigError, RunConfig
from minilmd.names import CORPUS_META, RUN_CONFIG_COPY, STAGED_CORPUS, STATE
from minilmd.place_rule import under_home, walk_problem, walk_to
from minilmd.run_config_copy import run_config_of
from minilmd.shared_place import gone_or_typo, look, same_source, staged_from
from minilmd.untrusted import holds_any


def has_started(cfg: RunConfig) -> bool:
    """A supervisor has run this run before: its state.json is a regular file in run.dir (not a link)."""
    try:
        return bool(cfg.run.dir) and stat.S_ISREG(os.lstat(cfg.run_dir / STATE).st_mode)
    except OSError:
        return False



def check_writable(name: str, path: Path) -> list[str]:
    """A path is usable if it is a writable directory, or its nearest existing ancestor is one."""
    probe = path
    try:
        while not probe.exists():
            if probe.parent == probe:
                break
            probe = probe.parent
    except PermissionError:  # a directory on the way that this user may not enter (another user's 0700 one)
        return [f"{name} = {str(path)!r}: {probe} cannot be examined (permission denied on a directory above it)"]
    if probe.exists() and not probe.is_dir():
        return [f"{name} = {str(path)!r}: {probe} is a file, not a directory"]
    if not os.access(probe, os.W_OK | os.X_OK):
        return [f"{name} = {str(path)!r}: {probe} is not writable"]
    return []



def textfile_problems(textfile: str) -> list[str]:
    """The Prometheus textfile's directory is one node_exporter's collector reads: there already (the supervisor
    writes the file in it and never creates it: a missing one is a typo, retried without end), a directory this
    user can write, and one no other user can write (textfile_dir_problem, daemon/host/prometheus.py's rule too)."""
    textfile_dir = Path(textfile).parent
    if _missing(textfile_dir):
        return [f"log.prometheus_textfile = {textfile!r}: {textfile_dir} does not exist (the textfile collector's "
                f"directory is made by whoever installs node_exporter, never by the run: a typo?)"]
    hostile = textfile_dir_problem(textfile_dir)
    return check_writable("log.prometheus_textfile", textfile_dir) + ([hostile] if hostile else [])


TEXTFILE_WORDS = ("log.prometheus_textfile", "the run's gauges",
                  "choose a directory only you (and root) can write, one per user where several users' runs report "
                  "(node_exporter's --collector.textfile.directory takes a glob of them): the collector exports "
                  "every file in it, so whoever else can write there can take your file's name first or report "
                  "gauges of your run's name beside yours")
"""(label, what, advice) of the textfile directory's walk: the same words at `run --check` and at each write."""


def textfile_dir_problem(textfile_dir: str | os.PathLike) -> str | None:
    """The rule of the Prometheus textfile's directory, at `run --check`, the launch and each write of the
    supervisor (daemon/host/prometheus.py), judged by the walk that opens it to write (open_textfile_dir): run.dir's
    (place_rule `closed`): it and every directory above it root's or ours, none another user can rearrange, and it
    itself one no other user can write, sticky or not. A sticky directory others may write (1777, as /tmp) let one
    of them make the file's name first, his file or his link, which the run never replaces (prometheus
    why_not_replaced: his gauges stood for the run's for good), or report gauges of the run's name in a file of his
    own beside it, which the collector exports all the same; it passed before (the GPU lock directory's rule, whose
    sticky exception is for a directory every user's runs must share: this one need not be)."""
    return walk_problem(textfile_dir, *TEXTFILE_WORDS, closed=True)


def open_textfile_dir(textfile_dir: str | os.PathLike) -> int:
    """A descriptor of the textfile's directory, reached by the walk textfile_dir_problem judges with (nothing
    made), for the supervisor to write through. PlaceRefused, FileNotFoundError, OSError as place_rule.walk_to."""
    return walk_to(textfile_dir, *TEXTFILE_WORDS, None, closed=True)[0]


def _missing(path: Path) -> bool:
    """Nothing at path, not even a link (one it cannot look at is not said missing: the other checks say why)."""
    try:
        os.lstat(path)
        return False
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False



def probe_problems(cfg: RunConfig, waits: list[str] | None) -> list[str]:
    """[eval] probe on shared storage, as staging judges it (minilmd/shared_place.py look: daemon/jobs/initstage.py
    stage_probe): one that is not there at a first launch while the directory above it holds other entries
    (gone_or_typo) is a typo, refused as data.prepared's and init.from's are, not waited for without end; any other
    absence (its share gone or not mounted) is waited for by staging: with `waits`, a line there. One there and not
    a prepared corpus is staging's to refuse, a data error (65), as the trainer's own."""
    probe = cfg.eval.probe
    answered, found, _ = bounded_probe(look, probe, CORPUS_META)
    if not answered or not found.outage:
        return []
    if not has_started(cfg) and (typo := bounded_probe(gone_or_typo, probe)[1]):
        return [f"eval.probe = {probe!r}: {found.what} ({typo}): a typo?"]
    if waits is not None:
        waits.append(f"eval.probe = {probe!r} is {found} now: the run waits for it, retrying with backoff (`minilmd "
                     f"status`: \"probe source unreachable since ..., retrying\")")
    return []



def launch_scratch(cfg: RunConfig) -> Path | None:
    """The scratch the launch will train in, as the checks may read it: cfg.scratch_dir; None where another user
    took the default scratch root (someone else's directory, a link or a file at its name: the launch never uses it
    and makes a new, empty private root instead, minilmd/scratch_root.py settle, which `run --check` says as a note,
    scratch_root.check_note). What stands in the taken root is that user's, never the run's checkpoints
    (probes.scratch_checkpoints), staged corpus (has_staged_copy) or its record (launch_staged_from). The one answer
    of every check that reads scratch (review2 F2; before, a corpus directory planted there was taken for the run's
    verified copy and a mistyped data.prepared passed `run --check`)."""
    if cfg.run.dir and scratch_root.check_note(cfg.scratch_dir, cfg.scratch_root_settled):
        return None
    return cfg.scratch_dir


def has_staged_copy(cfg: RunConfig) -> bool:
    """The launch's scratch (launch_scratch) holds a staged corpus (a directory, not a link), which staging trains
    from when its source cannot be read (daemon/jobs/staging.py stage, which verifies it first)."""
    if (scratch := launch_scratch(cfg)) is None:
        return False
    final = scratch / STAGED_CORPUS
    return final.is_dir() and not final.is_symlink()


def launch_staged_from(cfg: RunConfig) -> str | None:
    """The data.prepared the launch's scratch's staged copy was made from (shared_place.staged_from), None when it
    records none or the scratch is not the launch's (launch_scratch)."""
    scratch = launch_scratch(cfg)
    return staged_from(scratch) if scratch is not None else None


def corpus_without_copy(cfg: RunConfig, absent: str, waits: list[str]) -> list[str]:
    """A corpus that is not there at the restart of a run whose scratch holds no staged copy: as at a first launch,
    a typo when the directory above it holds other entries (gone_or_typo), said with the data.prepared the run
    started with (its run.toml) when that is another; else its share gone or not mounted, waited for."""
    prepared = cfg.data.prepared
    if typo := bounded_probe(gone_or_typo, prepared)[1]:
        before = _started_with(cfg)
        then = f"; this run started with data.prepared = {before!r} (its {RUN_CONFIG_COPY})" \
            if before and not same_source(before, prepared) else ""
        return [f"data.prepared = {prepared!r}: not there ({typo}), and scratch holds no staged copy of it{then}: "
                f"a typo?"]
    waits.append(f"data.prepared = {prepared!r} {absent}: this run has started before, but scratch holds no staged "
                 f"copy to train from, so it waits for the share (`minilmd status`: \"corpus source unreachable "
                 f"since ..., retrying\")")
    return []


def _started_with(cfg: RunConfig) -> str | None:
    """The data.prepared of the run's run.toml (the config its supervisor last started with), None when unread
    (run_config_of's refusal of a file not the run's, a ValueError, included)."""
    try:
        return run_config_of(cfg.run_dir).data.prepared
    except (ConfigError, ValueError, OSError):
        return None


def remote_parents_refused(root: str, config: mount_places.MountConfig | None = None) -> str:
    """Why the sync will not make the local run.remote `root`, the directories missing above it, or write in it
    ("" when it will): the one rule of what a sync makes (daemon/jobs/remote_local.py `_make_root`) and of what
    `run --check` refuses (`remote_problems`). A chain of missing directories is not made from "/" or from a directory
    shares are mounted in (minilmd/mount_places.py: /mnt, /media, /net, an autofs directory, the parent of a mount
    point fstab, an autofs map or a systemd mount unit names), where it is a share's mount point missing (a typo in
    the share's path, a mount point never made) and would put the "durable" copy on the local disk, said synced and
    verified at every sync; nor below an unmounted share's stub: an empty directory, not a mount point, that is where
    a share is set up to be mounted (named by fstab, an autofs map or a systemd unit, or root's inside a mount
    parent; an empty directory the user made is theirs to fill: `made_in_empty_directory`). In the user's home
    (place_rule.under_home), and below any other directory (/root, /workspace, /tmp/x), the chain is made. And
    nothing is made or written on a configured mount point nothing is mounted on now, the remote or the directory
    above it that is there (`unmounted_share`). `config`: the mount configuration of this check, read now when
    None."""
    path = os.path.normpath(os.path.abspath(root))
    config = config or mount_places.snapshot()
    return _chain_refused(path, config) or unmounted_share(path, config)


def _chain_refused(path: str, config: mount_places.MountConfig) -> str:
    parent = os.path.dirname(path)
    if not _missing(Path(path)) or not _missing(Path(parent)):
        return ""
    first = parent  # the first directory missing on the way down
    while _missing(Path(os.path.dirname(first))) and os.path.dirname(first) != first:
        first = os.path.dirname(first)
    there = os.path.dirname(first)
    if under_home(there):
        return ""
    parents = config.parents()
    try:
        stub = os.path.isdir(there) and not holds_any(there) and not mount_places.is_mount_point(there) and \
            config.is_stub(there)
    except OSError:
        stub = False
    if stub:
        what = f"{there} is an empty directory, not a mount point"
    elif there == os.sep or there in parents:
        where = "at the top level" if there == os.sep else f"in {there}"
        what = f"{there} holds no {os.path.basename(first)}, and nothing is made {where}, where shares are mounted"
    else:
        return ""
    return (f"{parent} is not there ({what}): minilmd makes no directory above run.remote there, which would put the "
            f"copy on the local disk; an unmounted share, or a typo in its path, looks like this: mount the share, "
            f"or make {parent} yourself")


def unmounted_share(path: str, config: mount_places.MountConfig) -> str:
    """Why nothing is made or written at the local run.remote `path` ("" when that is not why): it lies on a
    directory a mount table names as a mount point (the remote itself, or the nearest directory above it that is
    there) on which nothing is mounted now (mount_places.unmounted_point: /proc/self/mountinfo says, an automounter's
    place excepted). Its share not mounted yet (a boot before the mount, a failed mount), the directory is the stub
    on the local disk: the copy would go there and be hidden below the share once it is mounted."""
    if not (point := mount_places.unmounted_point(path, config)):
        return ""
    return (f"{point} is named as a mount point by {config.named_by(point)} but nothing is mounted there (its share "
            f"not mounted yet, or its mount failed): minilmd makes and writes nothing there, which would put the copy "
            f"on the local disk, hidden below the share once it is mounted: mount it, or choose another run.remote")


def remote_problems(remote: str, started: bool = False, waits: list[str] | None = None) -> list[str]:
    """A local run.remote the first sync can make: a writable directory, or the nearest one above it that is there
    is one, and on storage: no directory can be made in a view of the kernel (/proc, /sys), and as root the writable
    check cannot tell. Its missing parents must be ones the sync makes (`remote_parents_refused`): refused, exit 2,
    unless the run has `started` before (its state.json: a share gone or not mounted at a restart, after a reboot,
    which the sync and the fetch wait for, with `waits` a line here; daemon/jobs/remotewait.py says whether the
    start waits)."""
    path = Path(remote)
    if missing := remote_parents_refused(remote):
        if not started:
            return [f"run.remote = {remote!r}: {missing}"]
        if waits is not None:
            waits.append(f"run.remote = {remote!r}: {missing}; the sync fails, retried, until the share is there")
    problems = check_writable("run.remote", path)
    above = path
    while _missing(above) and above.parent != above:
        above = above.parent
    mount = mounts.mount_of(above) if not problems else None
    if mount is not None and mount.fstype in mounts.KERNEL_TYPES:
        problems.append(f"run.remote = {remote!r}: {above} is on {mount.fstype}, a view of the kernel, not storage: "
                        f"no directory can be made there")
    return problems


def made_in_empty_directory(root: str, config: mount_places.MountConfig | None = None) -> str:
    """The empty directory the first sync makes the local run.remote `root` in (or writes in, when it is `root`
    itself): the nearest directory on the way up from `root` that is there, when it is empty, no link, and no
    share's stub, as a directory the user made (none that the configuration names as a mount point, unless a share is
    mounted on it now: an empty share answers); "" when it is not that (it holds entries, is a link, cannot be looked
    at, or is named). For the caller to say what the first sync does, once `remote_parents_refused` said it may."""
    there = os.path.normpath(os.path.abspath(root))
    while _missing(Path(there)) and os.path.dirname(there) != there:
        there = os.path.dirname(there)
    try:
        if not stat.S_ISDIR(os.lstat(there).st_mode) or holds_any(there):
            return ""
        named = (config or mount_places.snapshot()).names(there)
        return there if not named or mount_places.is_mount_point(there) else ""
    except OSError:
        return ""
