"""What a killed process left beside its output: a temporary file or directory named by its maker (host, pid and,
in the newer names, start time and boot: minilmd/names.py). One rule for every clean-up of such leftovers (an export's
copy beside --out, a prepare's directory beside DIR, a checkpoint root's `.tmp-*`), because they run in
directories other users may write too: a leftover is removed only when its maker is gone and it is this user's own
file or directory; a symbolic link is never followed nor removed, another user's entry never deleted for them
(unlink needs only write permission on a sticky-less parent), another host's never judged by a pid of this host.
What is left is said, so that the user knows what to remove by hand. `sweep` is the one loop over a directory
that every clean-up runs (an export's, a prepare's and an append's, a checkpoint root's); given the directory
opened once (a minilmd/dirfd.py Dir: an export's --out's, the corpus lock's parent), it lists, looks and removes
through its descriptor, each leftover only while its name leads to what was looked at: never by path. Torch-free.
"""
from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minilmd.dirfd import Dir
from minilmd.perms import owned_by_me
from minilmd.proc_info import is_this_host, this_maker
from minilmd.procs import process_alive
from minilmd.untrusted import listed

Say = Callable[[str], None]
Maker = tuple[str | None, int, int | None, str]
"""(host, pid, start ticks, boot tag) a temporary name records of its maker; host None: a name that records no host
(this host's), ticks None: one that records no start time, boot "": one that records no boot
(tmpnames.prepare_tmp_maker, export_tmp_maker, root_tmp_maker)."""


@dataclass(frozen=True)
class Words:
    """How the messages name the maker and what it leaves: one="an export", tool="export", thing="temporary copy"."""

    one: str
    tool: str
    thing: str
    files: bool = True  # whether the maker makes files too (an export), or only directories (prepare, a save)


def stderr_say(tool: str) -> Say:
    """`minilmd TOOL: message` on stderr."""
    return lambda message: print(f"minilmd {tool}: {message}", file=sys.stderr, flush=True)


def me() -> tuple[str, int, int, str]:
    """(host tag, pid, start ticks, boot tag) of this process, as an export's or a prepare's temporary name records
    its maker (proc_info.this_maker, as a sync's on the remote does; the start ticks 0 where they cannot be read:
    these names always carry a number there, and the parsers read a 0 back as no start time, so that the maker,
    alive, is judged by its pid alone and never taken for a dead one)."""
    host, pid, ticks, boot = this_maker()
    return host, pid, ticks or 0, boot


def own(path: Path, st: os.stat_result, words: Words, say: Say) -> bool:
    """Whether `path` (lstat `st`) is this user's own real directory (or file, when the maker makes files): what
    a clean-up may remove. Anything else is said and left: a link, another user's entry, another kind of file."""
    if stat.S_ISLNK(st.st_mode):
        say(f"{path}: a symbolic link by {words.one}'s temporary name; left as it is ({words.one} never follows "
            f"nor removes one)")
        return False
    if not owned_by_me(st):
        say(f"{path}: left as it is: the {words.thing} of a killed {words.tool}, but another user's (uid "
            f"{st.st_uid}), which is theirs to remove")
        return False
    if stat.S_ISDIR(st.st_mode) or (words.files and stat.S_ISREG(st.st_mode)):
        return True
    kinds = "neither a file nor a directory" if words.files else "not a directory"
    say(f"{path}: left as it is: named as {words.one}'s {words.thing} but {kinds}")
    return False


def remove(path: Path, st: os.stat_result, pid: int, words: Words, say: Say, at: Dir) -> bool:
    """Remove a dead maker's leftover that `own` passed; True when it is gone. `at`: the directory it is in, opened
    once (sweep's): removed through its descriptor (no link inside followed), and only while it is the file or
    directory `st` looked at."""
    try:
        if not _remove_at(at, path.name, st):
            say(f"{path}: the {words.thing} of a killed {words.tool} (pid {pid}) was replaced by something else "
                f"while it was looked at, or is too deep to remove; left as it is")
            return False
    except FileNotFoundError:
        return True
    except OSError as e:
        say(f"{path}: the {words.thing} of a killed {words.tool} (pid {pid}) could not be removed ({e}); left")
        return False
    say(f"removed {path}: the {words.thing} of {words.one} (pid {pid}) killed before it finished")
    return True


def _remove_at(at: Dir, name: str, st: os.stat_result) -> bool:
    """`name` in `at` removed while it is the entry `st` looked at (Dir.remove_tree, Dir.remove_file: identity
    checked); False when it is not (or a tree too deep for remove_tree: not one a maker of ours made)."""
    identity = (st.st_dev, st.st_ino)
    if stat.S_ISDIR(st.st_mode):
        return at.remove_tree(name, identity)
    return at.remove_file(name, identity)


def clear(path: Path, host: str | None, pid: int, ticks: int | None, boot: str, out: Path, words: Words, say: Say,
          *, at: Dir, mine_is_dead: bool = False) -> str:
    """Settle one leftover by a maker's name: "running" when its maker still runs (left and not said: the caller
    decides; an export refuses), "removed", "left" (said why), or "gone" (no longer there: nothing done). `host` None: a
    name that records no host, taken as this host's (an older minilmd's prepare); `ticks` None: one that records no
    start time; `boot` "": one that records no boot (a name of another boot's maker is a dead one's). `mine_is_dead`: a
    name of this process's pid is taken for a dead maker's (a checkpoint root has one writer at a time: a `.tmp-*` of
    our pid there is an earlier holder's of a recycled pid, or our own failed save's). `at`: the directory `path` is in,
    opened once (sweep's): looked at and removed there."""
    st = at.lstat(path.name)
    if st is None:
        return "gone"  # its maker published or removed it meanwhile
    if stat.S_ISLNK(st.st_mode):
        own(path, st, words, say)  # a link is said as such, whoever's name it has
        return "left"
    if host is not None and not is_this_host(host):
        say(f"{path}: left as it is: {words.one}'s {words.thing} on host {host}, whether it still runs cannot be "
            f"told here; remove it once no {words.tool} to {out} is running there")
        return "left"
    if process_alive(pid, ticks, boot) and not (mine_is_dead and pid == os.getpid()):
        return "running"
    if not own(path, st, words, say):
        return "left"
    return "removed" if remove(path, st, pid, words, say, at) else "left"


def sweep(parent: Dir, match: Callable[[str], Maker | None], words: Words, say: Say, *, out: Path,
          skip: str | None = None, on_running: Callable[[Path, int], None] | None = None,
          mine_is_dead: bool = False, only_dirs_and_links: bool = False) -> list[Path]:
    """Every leftover in `parent` by a maker's name (`match`: a name -> its maker, None for any other name) settled
    by `clear`; returns those removed. `skip`: this process's own temporary name, never looked at. A live maker's
    is left, and `on_running(path, pid)` told (an export refuses; prepare says it). `out`: what the makers write,
    for the messages. `only_dirs_and_links`: anything else by such a name is another writer's, passed by unsaid (a
    checkpoint root, where a save makes directories and fsio its files). An unlistable parent, or one of more
    entries than untrusted.listed reads (one others filled): nothing found.
    `parent`: the directory opened once (and checked, where others may write): everything through its descriptor
    (`clear`'s `at`), whatever its path leads to by now; its path only names the leftovers in messages."""
    try:
        names = sorted(listed(parent.fd))
    except OSError:
        return []
    removed = []
    for name in names:
        maker = None if name == skip else match(name)
        if maker is None:
            continue
        path = parent.path / name
        if only_dirs_and_links and _neither_dir_nor_link(parent.lstat(name)):
            continue
        outcome = clear(path, *maker, out, words, say, at=parent, mine_is_dead=mine_is_dead)
        if outcome == "running" and on_running is not None:
            on_running(path, maker[1])
        elif outcome == "removed":
            removed.append(path)
    return removed


def say_running(words: Words, say: Say) -> Callable[[Path, int], None]:
    """A sweep's `on_running` that leaves a live maker's leftover and says so (a prepare's, an append's: under the
    corpus lock a live one is no writer of this output on this host, so nothing to refuse)."""
    return lambda path, pid: say(f"{path}: left as it is: named as {words.one}'s {words.thing}, and its process "
                                 f"(pid {pid}) still runs")


def _neither_dir_nor_link(st: os.stat_result | None) -> bool:
    if st is None:
        return True  # gone meanwhile: nothing to settle
    return not (stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode))
