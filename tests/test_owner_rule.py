"""One owner rule: every "is this file ours" check of minilmd (its code and its scripts: source_tree.audited_files)
asks minilmd/perms.py (own_uid, owned_by_me, owned_by_me_or_root, owner_in, LearntOwners), none asks os.geteuid(),
os.getuid() or os.getresuid() itself (the real uid, for whom a process acts towards others, is perms.signal_uid) nor
compares a file's st_uid by hand.

Before, scratch, the supervisor lock, the lease files and their directory, the registry, the Prometheus textfile,
the demo and perms.settle_new_file each compared with os.geteuid() by hand. Here perms.own_uid is faked to another
uid (no chown needed: a file of this process is then "another user's"), and each check must follow it. The checks
that accept root's directories too (the sticky /tmp, /dev/shm, /var/lock above ours) need a directory of neither
root nor the faked uid: as a user, one of this process's own; as root, one given to another uid (root can).
"""
from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest

import audit_calls
import source_tree
from minilmd import perms
from minilmd import scratch as scratchmod
from minilmd.daemon import demo
from minilmd.daemon.host import leases, prometheus, registry
from minilmd.daemon.host.lock import LockUnsafe, RunLock

REPO = source_tree.REPO
THE_MODULE = "minilmd/perms.py"
OTHER_UID = 4242
"""The owner given to a directory when the tests run as root: neither root nor this process."""


def fake_own_uid(monkeypatch, uid: int) -> None:
    monkeypatch.setattr(perms, "own_uid", lambda: uid)


def someone_else(path: Path) -> int:
    """A uid that is not the owner of path (nor root)."""
    return os.lstat(path).st_uid + 1


@pytest.fixture
def neither_roots(tmp_path) -> tuple[Path, int]:
    """(a directory owned by neither root nor, unless faked so, this process; its owner), mode 0755."""
    folder = tmp_path / "theirs"
    folder.mkdir()
    os.chmod(folder, 0o755)
    if os.geteuid() == 0:
        os.chown(folder, OTHER_UID, OTHER_UID)
    return folder, os.lstat(folder).st_uid


# --- "owned by me": a file or directory of this process is another user's once own_uid says so ----------------------

def test_scratch_of_this_process_is_not_yours_under_another_own_uid(tmp_path, monkeypatch):
    scratch, run_dir = tmp_path / "scratch", tmp_path / "run"
    scratch.mkdir(mode=0o700)
    assert scratchmod.problems(scratch, run_dir, False) == []
    fake_own_uid(monkeypatch, someone_else(scratch))
    (problem,) = scratchmod.problems(scratch, run_dir, False)
    assert f"run.scratch {scratch} belongs to" in problem and "not to you" in problem, problem
    assert scratchmod.remove_own(scratch, run_dir) and scratch.is_dir()  # left, said


def test_the_supervisor_lock_of_this_process_is_not_yours_under_another_own_uid(tmp_path, monkeypatch):
    fake_own_uid(monkeypatch, someone_else(tmp_path))
    with pytest.raises(LockUnsafe, match="belongs to uid"):
        RunLock(tmp_path).acquire()


def test_the_user_registry_of_this_process_is_not_yours_under_another_own_uid(tmp_path, monkeypatch):
    folder = tmp_path / "runs"
    registry._own_private_dir(folder)  # ours: accepted
    fake_own_uid(monkeypatch, someone_else(folder))
    with pytest.raises(registry.RegistryUnsafe, match="not to you"):
        registry._own_private_dir(folder)


def test_a_lease_file_of_this_process_is_read_only_under_another_own_uid(tmp_path, monkeypatch):
    (tmp_path / "gpu0.lease").write_text("")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        lease = leases._open_in(fd, tmp_path / "gpu0.lease", "gpu0.lease")
        assert lease.writable
        lease.close()
        fake_own_uid(monkeypatch, someone_else(tmp_path / "gpu0.lease"))
        lease = leases._open_in(fd, tmp_path / "gpu0.lease", "gpu0.lease")
        assert not lease.writable  # another user's lease file: flocked and read, never written
        lease.close()
    finally:
        os.close(fd)


def test_the_prometheus_textfile_of_this_process_is_not_replaced_under_another_own_uid(tmp_path, monkeypatch):
    textfile = tmp_path / "minilmd.prom"
    textfile.write_text("")
    assert prometheus.why_not_replaced(textfile) is None
    fake_own_uid(monkeypatch, someone_else(textfile))
    assert "not to this run's user" in (prometheus.why_not_replaced(textfile) or "")


def test_the_demo_leaves_a_directory_that_is_not_yours_under_another_own_uid(tmp_path, monkeypatch):
    root = tmp_path / "demo-run"
    (root / "kept").mkdir(parents=True)
    fake_own_uid(monkeypatch, someone_else(root))
    with pytest.raises(SystemExit, match="not to you"):
        demo.fresh_start(root)
    assert (root / "kept").is_dir()


def test_a_new_file_is_settled_only_when_yours_by_own_uid(tmp_path, monkeypatch):
    made = tmp_path / "model.safetensors"
    made.write_bytes(b"")
    os.chmod(made, 0o600)
    monkeypatch.setattr(perms, "file_mode", lambda: 0o644)
    fake_own_uid(monkeypatch, someone_else(made))
    perms.settle_new_file(made)
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o600  # not ours: never chmodded
    monkeypatch.setattr(perms, "own_uid", lambda: os.lstat(made).st_uid)
    perms.settle_new_file(made)
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o644


# --- "owned by me or root": a directory on the way, judged by own_uid ------------------------------------------------

def test_a_directory_above_scratch_is_judged_by_own_uid(neither_roots, monkeypatch):
    folder, owner = neither_roots
    scratch, run_dir = folder / "scratch", folder / "run"
    fake_own_uid(monkeypatch, owner)
    assert scratchmod.problems(scratch, run_dir, False) == []
    fake_own_uid(monkeypatch, owner + 1)
    (problem,) = scratchmod.problems(scratch, run_dir, False)
    assert "above it belongs to" in problem, problem  # the first one not root's nor the faked uid's


def test_the_lock_directory_is_judged_by_own_uid(neither_roots, monkeypatch):
    folder, owner = neither_roots
    os.chmod(folder, 0o1777)  # a sticky lock directory is safe if root's or ours alone: its owner may swap leases
    fake_own_uid(monkeypatch, owner)
    assert leases.lock_dir_problem(folder) is None
    fake_own_uid(monkeypatch, owner + 1)
    assert "belongs to" in (leases.lock_dir_problem(folder) or "")


def test_the_system_registry_is_judged_by_own_uid(neither_roots, monkeypatch):
    folder, owner = neither_roots
    fake_own_uid(monkeypatch, owner)
    assert registry._safe_shared_dir(folder)
    fake_own_uid(monkeypatch, owner + 1)
    assert not registry._safe_shared_dir(folder)


# --- no module asks the process's uids, or compares a file's owner, but perms.py ------------------------------------

UID_CALLS = {"geteuid", "getuid", "getresuid", "getfsuid"}
"""The process's uids by every name os and posix give them: own_uid and signal_uid ask them, nothing else does."""
UID_MODULES = ("os", "posix")


def owner_escapes(path: Path) -> list[int]:
    """The lines of a module that ask for the process's uids itself (os.getuid, os.getresuid, os.geteuid, called or
    passed, imported from os or posix, or reachable through a star import of either) or compare a file's owner
    (st_uid) by hand: each belongs in minilmd/perms.py (own_uid, signal_uid, owned_by_me, owner_in)."""
    module = source_tree.tree(path)
    found = [line for line, _, name in audit_calls.dynamic_lookups(module, set(UID_MODULES))
             if name is None or name in UID_CALLS]  # getattr(os, "getuid"), os.__dict__["geteuid"]
    for node in ast.walk(module):
        if isinstance(node, ast.Attribute) and node.attr in UID_CALLS:
            found.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in UID_CALLS:
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module in UID_MODULES:
            found += [node.lineno for alias in node.names if alias.name in UID_CALLS | {"*"}]
        elif isinstance(node, ast.Compare) and any(
                isinstance(part, ast.Attribute) and part.attr == "st_uid"
                for operand in (node.left, *node.comparators) for part in ast.walk(operand)):
            found.append(node.lineno)
    return sorted(set(found) | set(owners_compared_by_name(module)))


def _reads_owner(node: ast.AST, owner_functions: set[str]) -> bool:
    """The expression's value is a file's owner: a `.st_uid`, a call of a function of this module that returns one,
    or either chosen by `a if c else b`, `a or b`, `(x := a)` (not words made from one: an f-string)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "st_uid"
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id in owner_functions
    if isinstance(node, ast.IfExp):
        return _reads_owner(node.body, owner_functions) or _reads_owner(node.orelse, owner_functions)
    if isinstance(node, ast.BoolOp):
        return any(_reads_owner(value, owner_functions) for value in node.values)
    if isinstance(node, ast.NamedExpr):
        return _reads_owner(node.value, owner_functions)
    return False


def _own_nodes(scope: ast.AST):
    """The nodes of a function (or the module) but those of the functions defined in it, which are scopes of theirs."""
    for child in ast.iter_child_nodes(scope):
        yield child
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            yield from _own_nodes(child)


def _bound(target: ast.AST, value: ast.AST | None, owner_functions: set[str]) -> set[str]:
    """The names `target = value` binds to a file's owner (a tuple unpacked item by item when the value is one)."""
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts):
        return {name for t, v in zip(target.elts, value.elts, strict=True) for name in _bound(t, v, owner_functions)}
    if value is None or not _reads_owner(value, owner_functions):
        return set()
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def owners_compared_by_name(module: ast.Module) -> list[int]:
    """The lines that compare a name bound to a file's owner (`owner = os.lstat(p).st_uid; if owner != x`, `(uid :=
    owner_of(p)) not in ...`, a tuple unpacked from one) with anything but None, in the function that binds it or
    one nested in it: the same hand-made owner test as `st.st_uid != x`, one assignment away."""
    owner_functions = {f.name for f in ast.walk(module) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and any(isinstance(r, ast.Return) and r.value is not None and _reads_owner(r.value, set())
                               for r in _own_nodes(f))}
    found: list[int] = []

    def scan(scope: ast.AST, inherited: frozenset[str]) -> None:
        owners = set(inherited)
        nodes = list(_own_nodes(scope))
        for node in nodes:
            if isinstance(node, ast.Assign):
                owners |= {name for target in node.targets for name in _bound(target, node.value, owner_functions)}
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)):
                owners |= _bound(node.target, node.value, owner_functions)
        for node in nodes:
            if isinstance(node, ast.Compare):
                operands = [o.target if isinstance(o, ast.NamedExpr) else o for o in (node.left, *node.comparators)]
                against_none = any(isinstance(o, ast.Constant) and o.value is None for o in operands)
                if not against_none and any(isinstance(o, ast.Name) and o.id in owners for o in operands):
                    found.append(node.lineno)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                scan(node, frozenset(owners))
            elif isinstance(node, ast.ClassDef):
                scan(node, frozenset())

    scan(module, frozenset())
    return found


def guarded_files() -> list[Path]:
    """The files the owner rule reads: the audits of calls' (source_tree.audited_files: the code and the scripts,
    those without a suffix too, such as scripts/gpu-check), minilmd/perms.py alone aside."""
    return [path for path in source_tree.audited_files() if source_tree.relative(path) != THE_MODULE]


def test_no_module_but_perms_asks_the_uids_or_compares_an_owner():
    found = {f"{source_tree.relative(path)}:{line}" for path in guarded_files() for line in owner_escapes(path)}
    assert found == set(), "use minilmd.perms (own_uid, signal_uid, owned_by_me, owned_by_me_or_root, owner_in)"
    assert owner_escapes(REPO / THE_MODULE)  # the one place they are asked


def test_the_owner_guard_reads_the_scripts_and_exempts_perms_alone():
    """The scripts are Python the user runs too (a device check, scripts/gpu-check without a suffix): read like the
    code. Only minilmd/perms.py is exempt, by its path (before: any file named perms.py, and no script)."""
    read = {source_tree.relative(path) for path in guarded_files()}
    assert {"scripts/gpu-check", "scripts/gpu_check_part.py", "minilmd/procs.py", "daemon/supervisor.py",
            "trainer/loop/train.py"} <= read
    assert THE_MODULE not in read and len(source_tree.audited_files()) - len(read) == 1


def test_the_owner_guard_sees_each_spelling(tmp_path):
    """The spellings the construction audit slipped past the geteuid-only guard (/tmp/audit-construct/
    owner_escapes.py): the real uid, getresuid, a star import, another process's owner compared by hand; and a uid
    function fetched by a string (getattr, the module's __dict__)."""
    module = tmp_path / "m.py"
    module.write_text("import os\n"
                      "from os import *\n"                                   # 2
                      "from posix import getuid\n"                           # 3
                      "\n"
                      "def mine(p):\n"
                      "    st = os.lstat(p)\n"
                      "    return (st.st_uid == os.getuid()\n"                 # 7
                      "            or st.st_uid == os.getresuid()[1]\n"        # 8
                      "            or st.st_uid == geteuid()\n"                # 9
                      "            or st.st_uid == os.stat('/proc/self').st_uid)\n"  # 10
                      "ask = os.geteuid\n"                                    # 11
                      "uid = os.lstat('/').st_uid\n"                          # 12: read, not compared
                      "real = getattr(os, 'get' + 'uid')()\n"                 # 13
                      "eff = os.__dict__['geteuid']()\n"                      # 14
                      "nofollow = getattr(os, 'O_NOFOLLOW', 0)\n")            # 15: not a uid
    assert owner_escapes(module) == [2, 3, 7, 8, 9, 10, 11, 13, 14]


def test_the_owner_guard_follows_a_name_bound_to_an_owner(tmp_path):
    """An owner test made through a name (house9 item 3: registry, runarg, the sources' link rule, mount_places and
    remote_write compared `owner = os.lstat(p).st_uid` by hand, unseen by a guard that looked for st_uid in the
    comparison itself): a name bound from st_uid, a walrus, a tuple unpacked, a function of the module returning an
    owner; in a nested function too. Compared with None, counted or passed on, it is not flagged."""
    module = tmp_path / "m.py"
    module.write_text("import os\n"
                      "def owner_of(p):\n"
                      "    return os.lstat(p).st_uid\n"
                      "def judge(p, x):\n"
                      "    owner = os.lstat(p).st_uid\n"                         # 5
                      "    if owner != x:\n"                                     # 6: flagged
                      "        return owner is None\n"                           # 7: None: not an owner test
                      "    uid, mode = os.lstat(p).st_uid, 0\n"                  # 8
                      "    if mode == 0 or uid in (0, x):\n"                     # 9: flagged (uid, not mode)
                      "        return [e for u, e in x if u != owner]\n"         # 10: flagged
                      "    if (who := owner_of(p)) is None or who == 0:\n"       # 11: flagged
                      "        return None\n"
                      "    counts = {owner: 1}\n"
                      "    def inner(y):\n"
                      "        return y == owner\n"                              # 15: flagged
                      "    return counts[owner] > 1, inner\n"                    # 16: a count, not flagged
                      "def other(p, owner):\n"
                      "    return owner == 0\n")                                 # 18: a parameter, not bound here
    assert owner_escapes(module) == [6, 9, 10, 11, 15]


def test_the_remotes_owner_check_follows_own_uid(tmp_path, monkeypatch):
    """The uids a sync counts as its own on a remote (remote_write.OWN_UIDS) ask perms.own_uid at every look: before,
    a set taken at import kept the real uid "ours" after own_uid said otherwise (why_foreign, then named not_ours,
    said None for a directory that owned_by_me called another user's)."""
    from minilmd.daemon.jobs import remote_write

    step = tmp_path / "step-00000010"
    step.mkdir()
    assert remote_write.why_foreign(str(step)) is None
    fake_own_uid(monkeypatch, someone_else(step))
    assert not perms.owned_by_me(os.lstat(step))
    assert f"owned by uid {os.lstat(step).st_uid}" in (remote_write.why_foreign(str(step)) or "")
    assert remote_write.not_made_here(str(step)) is not None  # not removed nor set aside either


# --- "others can rearrange": the one rule for a directory whose entries must stay as this run left them -----------

@pytest.mark.parametrize("mode, sticky_owner_mine, rearrangeable", [
    (0o755, True, False),   # only its owner writes
    (0o775, True, True),    # group members count as others
    (0o777, True, True),
    (0o1777, True, False),  # sticky, mine (or root's): each entry's owner alone may remove or rename it
    (0o1777, False, True),  # sticky but another user's: its owner may remove anything in it
])
def test_others_can_rearrange_a_directory_writable_to_them_unless_sticky_and_safe(tmp_path, monkeypatch, mode,
                                                                                   sticky_owner_mine, rearrangeable):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, mode)
    st = os.lstat(folder)
    if not sticky_owner_mine:
        fake_own_uid(monkeypatch, someone_else(folder))
        if st.st_uid == 0:  # root's counts as safe whoever we are: give it to someone else
            os.chown(folder, OTHER_UID, OTHER_UID)
            st = os.lstat(folder)
    assert perms.others_can_rearrange(st) is rearrangeable
    assert registry._safe_shared_dir(folder) is (not rearrangeable and perms.owned_by_me_or_root(st))
