"""Whose run config minilmd runs: the one reading of the config file a user names (`minilmd run`, `run --check`,
`train`, `export`, `sample`, `verify`, `analyze --config`, an init.from naming a `.toml`, the supervisor's copy of it
in run.dir), by the views' owner rule (daemon/views/runarg.py).

A run config decides everything a run does in its user's name: its corpus, its learning rate and budget, its
run.dir and run.remote, what `sync.keep` prunes there, the weights a stage starts from. Before, any file at the
path was run, links followed: a teammate's `mv` of his config over hers in a team directory (group-writable, not
sticky) made her next start (a launcher's restart, a Slurm requeue) resume on his corpus with his lr, and his
`sync.keep` pruned her remote checkpoints (hostile audit 9 F1). So the config is read only when:
- every link on the way is root's or the user's (place_rule.link_followed, as the views follow a link);
- every directory on the way is root's or the user's and no other user can rearrange it (sticky ones of root's or
  hers excepted: place_rule's walk, on descriptors, so nothing swapped in after the judgement is read); one of
  hers writable by her user private group, named as she is (perms.named_private_group: umask 002's ~/configs,
  0775), is hers even where the user database cannot be listed to prove it (LDAP, sssd), for this reading only;
- the file itself is the user's or root's (perms.owned_by_me_or_root: the views' rule, less its "the run
  directory's owner" case, which a run cannot meet: run.dir must be the caller's or root's).
Anything else is refused, naming the link, directory or file and its owner, and the way out: copy the config into a
directory of your own and run that copy (a stage may name another user's run directory in init.from instead: its
run.toml is read as that run's own). Torch-free.
"""
from __future__ import annotations

import os

from minilmd import place_rule
from minilmd.perms import own_uid, owned_by_me_or_root, user_words
from minilmd.untrusted import Unreadable, printable, read_bytes

WAY_OUT = ("if it is the config you mean, copy it into a directory of your own (`cp {path} ~/`) and give that copy; "
           "a stage's init.from may name that run's run directory instead")
"""How a refused config is still run: the user's own copy of it."""

LABEL = "the directory of the run config"
WHAT = "the run config"
ADVICE = "copy it into a directory only you (and root) can change (such as one under your home) and give that copy"


class ConfigRefused(ValueError):
    """A config file minilmd does not run, the message saying whose it is and what to do (a ConfigError)."""


def read_own_config(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of the run config at `path` (at most max_bytes), read by the rule above: ConfigRefused for a link,
    a directory or a file not the user's (nor root's); Unreadable for what is not a regular file, too big, or
    missing (`missing`); an OSError of a directory on the way that cannot be looked at now (EACCES, EIO)."""
    shown = printable(os.fspath(path))
    try:
        real = place_rule.real_path(path)
    except place_rule.ForeignLink as e:
        raise ConfigRefused(f"{shown}: {printable(str(e.link))} is a symbolic link of {user_words(e.owner)}, "
                            f"{_not_whose()}: whoever owns a link chooses which config runs, so minilmd follows no "
                            f"other user's link to a run config; {WAY_OUT.format(path=shown)}") from None
    except place_rule.TooManyLinks as e:
        raise ConfigRefused(f"{shown}: {printable(str(e))}") from None
    try:  # the owner first: the refusal a teammate's config swapped in gets names him, not only his directory
        if not owned_by_me_or_root(st := os.lstat(real)):
            raise ConfigRefused(_not_yours(shown, st.st_uid))
    except (FileNotFoundError, NotADirectoryError):
        raise Unreadable("missing", path, missing=True) from None
    try:
        fd, _ = place_rule.walk_to(real.parent, LABEL, WHAT, ADVICE, None, reading=True)
    except FileNotFoundError:
        raise Unreadable("missing", path, missing=True) from None
    except place_rule.PlaceRefused as e:
        raise ConfigRefused(f"{shown}: {printable(str(e))}; minilmd runs no config that others can replace") from None
    try:
        try:
            st = os.lstat(real.name, dir_fd=fd)
        except FileNotFoundError:
            raise Unreadable("missing", path, missing=True) from None
        if not owned_by_me_or_root(st):
            raise ConfigRefused(_not_yours(shown, st.st_uid))
        return read_bytes(real.name, max_bytes=max_bytes, owner=(own_uid(), 0), dir_fd=fd)
    finally:
        os.close(fd)


def _not_whose() -> str:
    me = own_uid()
    return "not root's" if me == 0 else f"neither yours, {user_words(me)}, nor root's"


def _not_yours(shown: str, owner: int) -> str:
    return (f"{shown} is a run config of {user_words(owner)}, {_not_whose()}: whoever owns a run config chooses "
            f"what the run does in your name (its corpus, lr and budget, its run.dir and run.remote, what sync.keep "
            f"prunes there), so minilmd runs only your own or root's (a teammate in a team directory may have put his "
            f"there); {WAY_OUT.format(path=shown)}")

