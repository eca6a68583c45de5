"""Walking a directory tree through descriptors, bounded in depth: minilmd/dirfd.py's removal and flush of a tree.

No link is followed, and a tree deeper than MAX_TREE_DEPTH directories is refused (TooDeep) rather than walked:
minilmd makes none deeper than a few levels, so a deeper one is someone else's, or a trap (recursion without end).
Torch-free.
"""
from __future__ import annotations

import errno
import os

from minilmd.openflags import OPEN_FLAGS

OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_TREE_DEPTH = 64
"""How deep a tree dirfd empties and flushes."""


class TooDeep(OSError):
    """A tree deeper than MAX_TREE_DEPTH directories: not emptied nor flushed (checked before anything is removed)."""


def _too_deep(depth: int) -> None:
    if depth > MAX_TREE_DEPTH:
        raise TooDeep(errno.ELOOP, f"more than {MAX_TREE_DEPTH} directories deep: minilmd made no such tree, and "
                      "leaves it")


def depth_within(fd: int, levels: int) -> bool:
    """Whether the tree under the directory fd is at most `levels` directories deep (no link followed)."""
    for entry in os.scandir(fd):
        if entry.is_dir(follow_symlinks=False):
            if levels == 0:
                return False
            sub = os.open(entry.name, OPEN_DIR, dir_fd=fd)
            try:
                if not depth_within(sub, levels - 1):
                    return False
            finally:
                os.close(sub)
    return True


def empty_tree(fd: int, depth: int = 0) -> None:
    """Everything under the directory fd removed, no link followed. A tree deeper than MAX_TREE_DEPTH raises
    TooDeep before anything is removed (looked at first), or, should it grow meanwhile, where it is met."""
    if depth == 0 and not depth_within(fd, MAX_TREE_DEPTH):
        _too_deep(MAX_TREE_DEPTH + 1)
    _too_deep(depth)
    for entry in os.scandir(fd):
        if entry.is_dir(follow_symlinks=False):
            sub = os.open(entry.name, OPEN_DIR, dir_fd=fd)
            try:
                empty_tree(sub, depth + 1)
            finally:
                os.close(sub)
            os.rmdir(entry.name, dir_fd=fd)
        else:
            os.unlink(entry.name, dir_fd=fd)


def fsync_tree(fd: int, depth: int = 0) -> None:
    """Every file and directory under the directory fd, flushed, fd itself last: complete before it is renamed.
    TooDeep past MAX_TREE_DEPTH (a temporary directory of ours holds a few levels)."""
    _too_deep(depth)
    for entry in os.scandir(fd):
        flags = OPEN_FLAGS
        if entry.is_dir(follow_symlinks=False):
            flags |= os.O_DIRECTORY
        elif not entry.is_file(follow_symlinks=False):
            continue
        sub = os.open(entry.name, flags, dir_fd=fd)
        try:
            if entry.is_dir(follow_symlinks=False):
                fsync_tree(sub, depth + 1)
            os.fsync(sub)
        finally:
            os.close(sub)
    os.fsync(fd)


def mode_tree(fd: int, file_mode: int, dir_mode: int, depth: int = 0) -> None:
    """Every regular file under the directory fd given `file_mode`, every directory under it `dir_mode`, by fchmod
    on a descriptor opened without following a link (a link, a FIFO left as they are): a tree this process made in
    its own private directory, given its modes before it is published, whatever the umask made them. TooDeep past
    MAX_TREE_DEPTH."""
    _too_deep(depth)
    for entry in os.scandir(fd):
        is_dir = entry.is_dir(follow_symlinks=False)
        if not is_dir and not entry.is_file(follow_symlinks=False):
            continue
        flags = OPEN_FLAGS | (os.O_DIRECTORY if is_dir else 0)
        sub = os.open(entry.name, flags, dir_fd=fd)
        try:
            if is_dir:
                mode_tree(sub, file_mode, dir_mode, depth + 1)
            os.fchmod(sub, dir_mode if is_dir else file_mode)
        finally:
            os.close(sub)
