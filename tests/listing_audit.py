"""The listing audit's scanner (tests/test_listing_audit.py holds the reviews and the tests): every directory
listing in source_tree.audited_files(), under any spelling (tests/audit_calls.py): os.listdir, os.scandir, os.walk,
os.fwalk, glob.glob and glob.iglob, called or only named (`bounded_probe(os.listdir, root)` lists too), imported
under any name, `from posix import listdir`, `ls = os.listdir`, getattr(os, "listdir") (and getattr(os, name),
os.__dict__[...], vars(glob)[...]: a function of os or glob not spelled out counts as one); and Path's iterdir,
glob, rglob and walk, called on any object that is not an imported module (a method's name is all there is to go
by). minilmd/untrusted.py is the one bounded lister (dir_names) and is not read.
"""
from __future__ import annotations

import ast
import functools
from collections import Counter

import audit_calls
import audit_sites

THE_HELPER = "minilmd/untrusted.py"
WATCHED = {"os", "glob"}
MODULE_LISTINGS = {"os.listdir", "os.scandir", "os.walk", "os.fwalk", "glob.glob", "glob.iglob"}
METHOD_LISTINGS = {"iterdir", "glob", "rglob", "walk"}
"""pathlib.Path's: called on an object, they are counted by name whatever the object is."""


class _Listings(audit_sites.Scoped):
    def __init__(self, module: ast.Module) -> None:
        super().__init__()
        self.aliases = audit_calls.assigned_aliases(module, WATCHED)
        self.visit(module)

    def _kind(self, node: ast.AST) -> str | None:
        found = audit_calls.dynamic_lookup(node, WATCHED, self.aliases)
        if found:
            name = f"{found[0]}.{found[1] or '<getattr>'}"
            return name if name in MODULE_LISTINGS or found[1] is None else None
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            return self.aliases[node.id] if self.aliases.get(node.id) in MODULE_LISTINGS else None
        if not isinstance(node, ast.Attribute) or self.own_method(node):
            return None
        name = audit_calls.qualified(node, self.aliases)
        if name in MODULE_LISTINGS:
            return name
        if node.attr in METHOD_LISTINGS and (name is None or name.startswith("pathlib.")):
            return f".{node.attr}"  # p.iterdir(), Path(p).glob(...), Path.rglob
        return None

    def generic_visit(self, node: ast.AST) -> None:
        kind = self._kind(node)
        if kind:
            self.count(kind)
        if isinstance(node, ast.Attribute) and kind:
            return  # os.listdir counted: not its `os` again (nothing below an attribute is a listing of its own)
        super().generic_visit(node)


@functools.cache
def sites() -> dict[str, Counter]:
    """{module: Counter((function, listing))} of every directory listing in the project, the bounded lister's
    aside."""
    return audit_sites.sites(lambda name, module: _Listings(module).found, skip=THE_HELPER)
