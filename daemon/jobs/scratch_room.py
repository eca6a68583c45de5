"""Will it fit? The space a run needs in scratch (its corpus, the staged probe and init.from copies, the checkpoints
kept between two syncs, a margin) against the free space of the scratch filesystem and, for a RAM disk, the memory
left for training. A shortage is told apart: scratch can never hold it (a config error, final: ScratchTooSmall, or a
refusal at `run --check` and the launch) or others hold that space now (waited for: ScratchFull, or a `waits` line
at the launch). The arithmetic (`fit_problem`, `ever_fits`) is pure, so that it is testable. Torch-free.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from minilmd import init_stall, mounts
from minilmd import scratch as scratchmod
from minilmd.config import RunConfig
from minilmd.config_values import out_of_range
from minilmd.corpus_meta import read_corpus_meta
from minilmd.daemon.jobs.staging_errors import ScratchFull, ScratchTooSmall
from minilmd.fmt import fmt_mb as _mb
from minilmd.names import CORPUS_META as META
from minilmd.names import CORPUS_TOKENIZER, STAGED_CORPUS
from minilmd.perms import own_uid
from minilmd.roomwords import room_now
from minilmd.urls import is_url

MIB = 1024 ** 2
GIB = 1024 ** 3
SPACE_MARGIN = 64 * MIB
"""Kept free on the scratch filesystem beyond the run's own files: a quarantined checkpoint, the temporary names of
a copy or a fetch in progress. Every refusal shows it."""
START_INODES = 32
"""Inodes the trainer makes in scratch after staging, besides the corpus: its lock (minilmd/trainer_lock.py), the
launch's four compile-cache directories, the checkpoints' directory and one checkpoint (its directory, weights,
optimizer and its meta, trainer state, tokenizer files, a DPO run's reference sums, manifest) with its pointers'
temporary names: about 20, rounded up. Staging waits until they are free too, and so does the wait for room
(daemon/phases/spacewait.py): a scratch left with exactly the inodes staging uses (another user's empty files)
otherwise ends the start after staging (hostile9 F2)."""
CHECKPOINT_BYTES_PER_PARAMETER = 12
"""fp32 weights (4) and AdamW's two fp32 moments (8), whatever the training precision."""
CHECKPOINT_OVERHEAD = 256 * 1024
"""A checkpoint's small files and safetensors headers, beyond its tensors and its tokenizer copy."""


@dataclass
class SpaceNeed:
    """What a run needs in scratch, part by part, so that a refusal can show the whole sum."""

    parts: list[tuple[int, str]]
    """(bytes, what for), e.g. (5_300_000, "for the corpus")."""
    held: int = 0
    """Bytes this run's scratch already holds (a restart): they are part of `parts` and count as room."""
    inodes: int = 0
    """The files staging will copy into scratch (the corpus's, meta.json; those a restart finds staged already left
    out), as staging counts them (inode_problem)."""
    margin: int = field(default=SPACE_MARGIN)

    @property
    def files(self) -> int:
        return sum(n for n, _ in self.parts)

    @property
    def total(self) -> int:
        return self.files + self.margin

    def describe(self) -> str:
        terms = [f"{_mb(n)} {what}" for n, what in self.parts]
        terms.append(f"a {self.margin / MIB:g} MiB margin ({_mb(self.margin)})")
        return " + ".join(terms) + f" = {_mb(self.total)}"


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _mount_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem type) of the filesystem holding `path` (minilmd/mounts.py); (path, "") when
    /proc/self/mountinfo names none: an unknown filesystem, neither a RAM disk nor a local disk."""
    found = mounts.mount_of(path)
    return (found.point, found.fstype) if found else (str(path), "")


def memory_headroom(total_memory: int) -> int:
    """Memory left free for training when staging into a tmpfs: max(2 GiB, 20 % of RAM)."""
    return max(2 * GIB, total_memory // 5)


def fit_problem(need: SpaceNeed, scratch: str, mount: str, fstype: str, free_bytes: int,
                available_memory: int | None = None, headroom: int | None = None,
                alternative: str | None = None) -> str | None:
    """Why `need` does not fit in scratch (None: it fits). Pure arithmetic, so that it is testable.
    `available_memory` and `headroom` only count for a RAM disk (mounts.is_ram: tmpfs, ramfs), whose pages are
    memory."""
    reasons = []
    if need.total > free_bytes + need.held:
        held = f" besides the {_mb(need.held)} this run's scratch already holds" if need.held else ""
        reasons.append(f"{mount} ({fstype or 'unknown fs'}) has {_mb(free_bytes)} free{held}")
    if mounts.is_ram(fstype) and available_memory is not None and headroom is not None:
        adds = max(0, need.files - need.held)
        if available_memory - adds < headroom:
            reasons.append(f"{mount} is a RAM disk: {_mb(available_memory)} of memory is available, the run would "
                           f"take {_mb(adds)} more of it, and {_mb(headroom)} must stay free for training "
                           f"(max(2 GiB, 20 % of RAM))")
    if not reasons:
        return None
    hint = f"; set run.scratch to a local-disk directory, e.g. {alternative}" if alternative else \
        "; set run.scratch to a directory on a local disk with enough space"
    return f"run.scratch {scratch} needs {need.describe()}, but " + " and ".join(reasons) + hint


def _alternative_scratch(scratch: Path, needed: int) -> str | None:
    """A local-disk directory with room for the run, to name in the refusal (per user, like the default): on a
    disk of this host's (mounts.is_local_disk), never a RAM disk, a network or FUSE one, or an unknown one."""
    for candidate in (Path("/var/tmp"), Path.home(), Path("/tmp")):
        try:
            if candidate.is_dir() and mounts.is_local_disk(_mount_of(candidate)[1]):
                st = os.statvfs(candidate)
                free = st.f_bavail * st.f_frsize
                if free > needed:
                    return f"{candidate / f'minilmd-{own_uid()}' / scratch.name} ({_mb(free)} free)"
        except OSError:
            continue
    return None


def ever_fits(need: SpaceNeed, fstype: str, capacity_bytes: int, total_memory: int, headroom: int) -> bool:
    """Whether `need` would fit if nothing but this run used the scratch filesystem (`capacity_bytes`: its size,
    less what only root may use) and, on a RAM disk, the machine's memory: then a shortage is another job's space,
    to wait for; otherwise the config must change (run.scratch)."""
    if need.total > capacity_bytes:
        return False
    return not mounts.is_ram(fstype) or need.files + headroom <= total_memory


@dataclass
class NoRoom:
    """Why a run's need does not fit in scratch, and whether it ever could."""

    problem: str
    """The refusal: the whole sum, the free space (and memory), a local-disk alternative."""
    ever_fits: bool
    """True: scratch is big enough, others hold the space now (`ever_fits`)."""


def space_problem(need: SpaceNeed, scratch_dir: Path, memory_headroom_bytes: int | None = None) -> NoRoom | None:
    """fit_problem() with the free space, filesystem and memory of where `scratch_dir` is (or will be). The memory
    headroom of a RAM disk defaults to max(2 GiB, 20 % of RAM)."""
    probe = _existing_ancestor(scratch_dir)
    st = os.statvfs(probe)
    mount, fstype = _mount_of(probe)
    vm = psutil.virtual_memory()
    headroom = memory_headroom(vm.total) if memory_headroom_bytes is None else memory_headroom_bytes
    free = st.f_bavail * st.f_frsize
    if fit_problem(need, str(scratch_dir), mount, fstype, free, vm.available, headroom) is None:
        return None
    problem = fit_problem(need, str(scratch_dir), mount, fstype, free, vm.available, headroom,
                          _alternative_scratch(scratch_dir, need.total))
    assert problem is not None  # the same arithmetic, with a hint added
    capacity = (st.f_blocks - (st.f_bfree - st.f_bavail)) * st.f_frsize
    return NoRoom(problem, ever_fits(need, fstype, capacity, vm.total, headroom))


def check_fit(needed: int, scratch_dir: Path, memory_headroom_bytes: int | None = None) -> None:
    """Raise ScratchFull (wait: others hold the space) or ScratchTooSmall (final: it never fits) with the whole
    arithmetic if `needed` bytes of corpus files do not fit in scratch_dir."""
    no_room = space_problem(SpaceNeed([(needed, "for the corpus files to copy")]), scratch_dir,
                            memory_headroom_bytes)
    if no_room is not None:
        raise (ScratchFull if no_room.ever_fits else ScratchTooSmall)(no_room.problem)


def check_inodes(files: int, scratch_dir: Path) -> None:
    """Raise ScratchFull (wait: others' entries hold them) or ScratchTooSmall (final: the file system has fewer in
    all) when `inode_problem` finds one: staging's own check."""
    no_room = inode_problem(files, scratch_dir)
    if no_room is not None:
        raise (ScratchFull if no_room.ever_fits else ScratchTooSmall)(no_room.problem)


def inode_problem(files: int, scratch_dir: Path) -> NoRoom | None:
    """Whether scratch's file system has fewer inodes free than staging's `files` and the trainer's start after it
    (START_INODES) need, and whether it ever could have them (fewer in all: never); None where it does not count them
    (btrfs, many NFS servers). The one inode rule of staging (check_inodes) and of `run --check` and the launch
    (run_space_problem)."""
    vfs = os.statvfs(_existing_ancestor(scratch_dir))
    needs = files + START_INODES
    if not vfs.f_files or vfs.f_favail >= needs:
        return None
    words = room_now(scratch_dir) or f"{vfs.f_favail:,} free"
    problem = (f"run.scratch {scratch_dir} needs {needs:,} inodes ({files:,} for the corpus files to copy + "
               f"{START_INODES} for the trainer's start: its lock, compile caches, a checkpoint), but {words}")
    if vfs.f_files < needs + 1:  # its root is one of them
        return NoRoom(f"{problem}; its file system has {vfs.f_files:,} in all: set run.scratch to a directory with "
                      f"more", ever_fits=False)
    return NoRoom(problem, ever_fits=True)


def checkpoint_bytes(cfg: RunConfig, tokenizer_bytes: int) -> int:
    """The size of one checkpoint of this model: 12 bytes per parameter, the tokenizer copy, small files."""
    from minilmd.model_shapes import expected_state_shapes

    parameters = sum(math.prod(shape) for shape in expected_state_shapes(cfg.model).values())
    return parameters * CHECKPOINT_BYTES_PER_PARAMETER + tokenizer_bytes + CHECKPOINT_OVERHEAD


def checkpoints_kept(cfg: RunConfig) -> tuple[int, str]:
    """How many checkpoints scratch holds at most between two syncs, and the sum that gives it. Under the
    supervisor scratch is pruned after each verified sync down to keep_local (without a remote: at once), so every
    save since the last sync stays, and one more is being written."""
    t, keep = cfg.train, cfg.train.keep_local
    if not cfg.run.remote:
        return keep + 1, f"train.keep_local {keep} + 1 being written"
    every, every_s = t.checkpoint_every, t.checkpoint_every_s
    if every_s is None:
        between = 1
        how = f"1 saved between two syncs (checkpoint_every is {every} steps, whose duration is not known before " \
              f"the run: counted as one)"
    else:
        between = math.ceil(cfg.sync.every_s / every_s)
        how = f"{between} saved between two syncs (sync.every {cfg.sync.every!r} / checkpoint_every {every!r})"
    return keep + between + 1, f"train.keep_local {keep} + {how} + 1 being written"


def _bytes_under(root: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(root):  # never follows a link
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def run_space_need(cfg: RunConfig) -> SpaceNeed | None:
    """What the run needs in scratch: the corpus (every file meta.json lists), the staged probe val split and
    init.from copy (daemon/jobs/initstage.py `space_parts`: their sources' sizes) and the checkpoints kept between
    two syncs. None when the corpus's cannot be known before staging (a corpus behind a URL, an unreadable
    meta.json). Reads shared storage: `run_space_problem` asks it in a bounded thread."""
    from minilmd.daemon.jobs.initstage import space_parts

    meta = read_corpus_meta(cfg.data.prepared) if not is_url(cfg.data.prepared) else None
    files = meta.get("files") if meta else None
    if not isinstance(files, dict) or not all(isinstance(e, dict) and isinstance(e.get("size"), int)
                                              for e in files.values()):
        return None
    corpus = sum(e["size"] for e in files.values()) + (Path(cfg.data.prepared) / META).stat().st_size
    tokenizer = files.get(CORPUS_TOKENIZER, {}).get("size", 0)
    count, why = checkpoints_kept(cfg)
    one = checkpoint_bytes(cfg, tokenizer)
    scratch = cfg.scratch_dir
    ours = scratch.is_dir() and not scratchmod.problems(scratch, cfg.run_dir, cfg.scratch_is_default)
    staged = scratch / STAGED_CORPUS
    to_copy = sum(1 for rel in [*files, META] if not (ours and os.path.lexists(staged / rel)))
    return SpaceNeed([(corpus, "for the corpus"), *space_parts(cfg),
                      (count * one, f"for {count} checkpoints of {_mb(one)} ({why})")],
                     held=_bytes_under(scratch) if ours else 0, inodes=to_copy)


def run_space_problem(cfg: RunConfig, waits: list[str] | None = None) -> list[str]:
    """The run's corpus and checkpoints can never fit in its scratch, in bytes or in inodes (inode_problem, staging's
    rule: before, `--check` passed a scratch with no inode left and staging then waited): the refusal with the whole
    sum (a config check: `minilmd run --check` and the launch give it to load_config). When they would fit but others
    hold the room now, no refusal: a line for `waits` (the run waits for room in staging). Nothing when a value it
    needs is out of range (the config check says so) or the corpus cannot be read yet."""
    if out_of_range(cfg) or not cfg.data.prepared or not cfg.run.dir:
        return []
    if init_stall.stalled(cfg.init.from_):  # the look would stall on it too, in silence: staging measures, refuses
        return []
    from minilmd.probes import bounded_probe

    answered, need, _ = bounded_probe(run_space_need, cfg)  # a stalled source: staging's to wait for and show
    try:
        no_room = (space_problem(need, cfg.scratch_dir) or inode_problem(need.inodes, cfg.scratch_dir)
                   if answered and need is not None else None)
    except OSError:
        return []  # the paths are the config check's to report
    if no_room is None:
        return []
    if not no_room.ever_fits:
        return [no_room.problem]
    if waits is not None:
        waits.append(f"{no_room.problem}; scratch is big enough, others hold that space now: the run waits for "
                     f"room, retrying with backoff (`minilmd status`: \"no room in scratch since ..., retrying\")")
    return []
