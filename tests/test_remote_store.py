"""Storage behind one Protocol (daemon/jobs/remote_store.py's RemoteStore): the sync, its fetch and the LoRA base's
copy ask the remote what they mean (`renames_into_place`, `made_here`, `set_aside`, `not_ours`, `look`), never which
kind of store it is. A caller that branches on the remote's own `local` flag again couples itself to one
implementation, and a second store (or the local and fsspec halves split apart) breaks it unseen."""
from __future__ import annotations

import ast

import source_tree

REMOTE_MODULES = ("remote.py", "remote_publish.py", "remote_write.py", "remote_store.py")
"""The remote's own modules, daemon/jobs/remote*.py: the implementation may know which kind it is."""


def _reads_of_local() -> list[str]:
    found = []
    for path in source_tree.code_files():
        rel = path.relative_to(source_tree.REPO)
        if rel.parent.as_posix() == "daemon/jobs" and rel.name in REMOTE_MODULES:
            continue
        found += [f"{rel}:{node.lineno}" for node in ast.walk(source_tree.tree(path))
                  if isinstance(node, ast.Attribute) and node.attr == "local"]
    return found


def test_no_caller_outside_the_remote_asks_which_kind_of_store_it_is():
    assert _reads_of_local() == [], "read the remote's `local` flag outside daemon/jobs/remote*.py: ask RemoteStore " \
                                    "a named question instead (renames_into_place, made_here, set_aside, ...)"

