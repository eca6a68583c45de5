"""One "may another user write here" rule: every test of a file's or directory's group or other write bit, or its
sticky bit, is made in minilmd/perms.py (others_can_write, others_can_rearrange, who_else_writes), which trusts a
group whose only member is this user on a local file system (Debian's and Ubuntu's user private groups, umask 002).

Before, compile_cache (`st.st_mode & 0o022`), scratch (`S_IWGRP | S_IWOTH`), the squash-root remote and the place
rule each wrote the rule again, counting every group as others: a 0775 TORCHINDUCTOR_CACHE_DIR of this user's own
group was refused ("whoever else can write it can put kernels there") where the place rule accepted it. The audit
lists each `<...st_mode...> & <bits>` whose bits hold a group or other write bit or the sticky bit (a literal, or
stat's S_IWGRP, S_IWOTH, S_ISVTX, S_IRWXG, S_IRWXO) outside perms.py, but for the reviewed uses below, each held to
its exact count (tests/test_owner_rule.py does the same for st_uid).
"""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import source_tree

THE_MODULE = "minilmd/perms.py"
OTHERS_BITS = 0o022 | 0o1000
"""Group write, other write, sticky."""
OTHERS_NAMES = {"S_IWGRP", "S_IWOTH", "S_ISVTX", "S_IRWXG", "S_IRWXO"}

REVIEWED = Counter({
    # the kernel's refusal, not a trust rule: a rename onto another user's name in a sticky directory is refused
    ("minilmd/dirfd.py", "os.fstat(dst_fd).st_mode & stat.S_ISVTX"): 1,
    ("minilmd/fsio.py", "os.fstat(parent.fd).st_mode & stat.S_ISVTX"): 1,
    # "exactly 0700": a directory this process just made private, or makes private again (any group/other bit)
    ("minilmd/dirfd.py", "stat.S_IMODE(st.st_mode) & 63"): 1,
    ("daemon/host/registry.py", "st.st_mode & 63"): 1,
    # the wording of the place rule's refusals ("sticky or not"), and which of its two refusals it is
    ("minilmd/dir_rule.py", "st.st_mode & stat.S_ISVTX"): 1,
    # own_place: only a directory the printed command's own check (OWN_DIR_CODE, pasted where minilmd may not be
    # importable) accepts, and that check cannot tell a user private group from a team's (hostile audit 10 F3)
    ("minilmd/init_model.py", "st.st_mode & 18"): 1,
})
"""(file, expression as ast.unparse writes it): how many times it is there. One more (a new test to review) or one
fewer (a stale entry) fails."""


def _others_bits(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, int) and not isinstance(expr.value, bool) and bool(expr.value & OTHERS_BITS)
    if isinstance(expr, (ast.Attribute, ast.Name)):
        return (expr.attr if isinstance(expr, ast.Attribute) else expr.id) in OTHERS_NAMES
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        return _others_bits(expr.left) or _others_bits(expr.right)
    return False


def _mentions_a_mode(expr: ast.expr) -> bool:
    return any(isinstance(part, ast.Attribute) and part.attr == "st_mode" for part in ast.walk(expr))


def mode_bit_tests(path: Path) -> list[tuple[int, str]]:
    """(line, expression) of each `mode & bits` in `path` (either side) that tests a group or other write bit or
    the sticky bit of a stat's st_mode."""
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(source_tree.tree(path))
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd)
            and ((_mentions_a_mode(node.left) and _others_bits(node.right))
                 or (_mentions_a_mode(node.right) and _others_bits(node.left)))]


def outside_perms(files: list[Path], reviewed: Counter = REVIEWED) -> list[str]:
    found, seen = [], Counter()
    for path in files:
        rel = source_tree.relative(path)
        if rel == THE_MODULE:
            continue
        for line, expr in mode_bit_tests(path):
            if (rel, expr) in reviewed:
                seen[(rel, expr)] += 1
            else:
                found.append(f"{rel}:{line}: {expr}")
    found += [f"{rel}: {expr} x{seen[(rel, expr)]}, listed in REVIEWED x{n}"
              for (rel, expr), n in sorted(reviewed.items()) if seen[(rel, expr)] != n]
    return found


def test_every_write_or_sticky_bit_test_is_made_in_perms():
    problems = outside_perms(list(source_tree.audited_files()))
    assert not problems, ("a group/other write bit or the sticky bit tested outside minilmd/perms.py: ask "
                          "perms.others_can_write or others_can_rearrange (the one rule, private groups "
                          "included), or review it into REVIEWED:\n" + "\n".join(problems))
    assert mode_bit_tests(source_tree.REPO / THE_MODULE)  # the scan sees the one place


def test_the_audit_sees_each_spelling(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os, stat\nfrom stat import S_IWOTH\n"
                   "def f(st, p):\n"
                   "    a = st.st_mode & 0o022\n"                              # 4
                   "    b = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)\n"      # 5
                   "    c = S_IWOTH & os.stat(p).st_mode\n"                    # 6
                   "    d = stat.S_IMODE(st.st_mode) & 0o002\n"                # 7
                   "    e = st.st_mode & stat.S_ISVTX\n"                       # 8
                   "    g = st.st_mode & 0o700\n"                              # 9: the owner's bits: not others'
                   "    h = st.st_mode & stat.S_IFMT\n"                        # 10
                   "    i = n & 0o022\n",                                       # 11: no mode
                   encoding="utf-8")
    assert [line for line, _ in mode_bit_tests(bad)] == [4, 5, 6, 7, 8]
    assert outside_perms([bad], Counter({("gone.py", "st.st_mode & 18"): 1})) == [
        *(f"{source_tree.relative(bad)}:{line}: {expr}" for line, expr in mode_bit_tests(bad)),
        "gone.py: st.st_mode & 18 x0, listed in REVIEWED x1"]
