"""A POSIX ACL on run.dir (minilmd/dir_rule.py inherited_acl_problem, perms.default_acl_writers): a default ACL
takes the umask's place for what is made in the directory, so `setfacl -d -m o::rwx RUN_DIR` (or a named user's
entry with write) made the run's files, 0600 under run.share's umask, writable by another user (0646). Refused
where run.dir is judged (`run --check`, the launch, `minilmd train`: place_rule.run_dir_problem and the walk that
makes it), also on the directory a missing run.dir would be made in, which passes it on; a default ACL that lets
others read only, or whose mask takes the write away, passes. An access ACL letting another user write run.dir
itself shows in its mode's group bits (the mask) and is refused as any directory others can write. The ACLs are
planted with os.setxattr (no setfacl needed); skipped on a file system without ACLs."""
from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import pytest

from minilmd.config import load_config
from minilmd.perms import private_group
from minilmd.place_rule import PlaceRefused, run_dir_problem, settle_run_dir
from second_user import second_user
from supervisor_helpers import cli, write_config

OBJ = 0xFFFFFFFF  # the qualifier of the owner, owning group, mask and other entries (ACL_UNDEFINED_ID)
USER_OBJ, USER, GROUP_OBJ, MASK, OTHER = 0x01, 0x02, 0x04, 0x10, 0x20


def acl(*entries: tuple[int, int, int]) -> bytes:
    """A POSIX ACL xattr of `entries` (tag, permission bits, qualifier), as setfacl writes it."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, who) for tag, perm, who in entries)


def other_rwx() -> bytes:
    """setfacl -d -m o::rwx: the owner rwx, the owning group r-x, every other user rwx."""
    return acl((USER_OBJ, 7, OBJ), (GROUP_OBJ, 5, OBJ), (OTHER, 7, OBJ))


def user_entry(uid: int, perm: int, mask: int = 7) -> bytes:
    """setfacl -d -m u:UID:PERM (and -m m::MASK): the owner rwx, that user PERM, group r-x, mask, others r-x."""
    return acl((USER_OBJ, 7, OBJ), (USER, perm, uid), (GROUP_OBJ, 5, OBJ), (MASK, mask, OBJ), (OTHER, 5, OBJ))


def planted(path: Path, value: bytes, kind: str = "default") -> None:
    try:
        os.setxattr(path, f"system.posix_acl_{kind}", value)
    except OSError as e:
        pytest.skip(f"no POSIX ACLs on {path}'s file system ({e})")


def _refusal(run_dir: Path) -> tuple[str | None, str | None]:
    """(run_dir_problem's words, the launch walk's), the walk's without its "(found so when opened)"."""
    try:
        settle_run_dir(run_dir)
        settled = None
    except PlaceRefused as e:
        settled = str(e).removesuffix(" (found so when opened)")
    return run_dir_problem(run_dir), settled


def test_a_default_acl_lets_another_user_write_what_the_run_makes_through_the_umask(tmp_path):
    """What the rule is about: under run.share = "private" (umask 077), what the run makes through the umask, as
    the attempt logs' directory (daemon/child/process.py `launch`: mkdir, 0777 less the umask) and TensorBoard's
    event files (open(), 0666 less the umask) are made, gets the default ACL's entries instead: `o::rwx` made them
    0757 and 0646, a named user's rwx entry his to write."""
    from minilmd import perms

    uid, _ = second_user()
    (tmp_path / "o").mkdir(mode=0o755)
    planted(tmp_path / "o", other_rwx())
    (tmp_path / "u").mkdir(mode=0o755)
    planted(tmp_path / "u", user_entry(uid, 7))
    old = os.umask(0o022)
    try:
        perms.apply("private")
        for name in ("o", "u"):
            (tmp_path / name / "logs").mkdir()
            (tmp_path / name / "events.out.tfevents").write_bytes(b"")
    finally:
        os.umask(old)
    assert [(tmp_path / "o" / name).stat().st_mode & 0o777 for name in ("logs", "events.out.tfevents")] == [0o757,
                                                                                                          0o646]
    assert (tmp_path / "u" / "logs").stat().st_mode & 0o070 == 0o070  # the mask: his rwx
    assert (tmp_path / "u" / "events.out.tfevents").stat().st_mode & 0o070 == 0o060


def test_run_dir_with_a_default_acl_letting_others_write_is_refused_by_check_and_walk(tmp_path):
    """Refused with its fix: `setfacl -k` (the whole default ACL), and where only a named entry lets another user
    write, `setfacl -x d:u:UID` of it alone (docs/operations.md's upgrade note: a run.dir an older version accepted
    is refused at its next start, these words in its log and status). Before, only `setfacl -k` was said."""
    uid, _ = second_user()
    for name, value, who in (("o", other_rwx(), "every user"), ("u", user_entry(uid, 7), f"user nobody (uid {uid})"),
                             ("w", user_entry(uid, 6), f"user nobody (uid {uid})")):
        run_dir = tmp_path / name
        run_dir.mkdir(mode=0o755)
        assert _refusal(run_dir) == (None, None)
        planted(run_dir, value)
        problem, settled = _refusal(run_dir)
        said = f"run.dir {run_dir}: the directory {run_dir} has a default ACL that lets {who} write what is made in it"
        assert problem == settled and problem and problem.startswith(said), problem
        entry = "" if name == "o" else f", or setfacl -x d:u:{uid} {run_dir} (those entries alone)"
        assert f"; setfacl -k {run_dir} (it is yours){entry}, or set run.dir to a directory only you" in problem, \
            problem
        assert os.listdir(run_dir) == []
        if name != "o":  # what `setfacl -x d:u:UID` leaves: the default ACL without that entry, which passes
            planted(run_dir, acl((USER_OBJ, 7, OBJ), (GROUP_OBJ, 5, OBJ), (MASK, 5, OBJ), (OTHER, 5, OBJ)))
            assert _refusal(run_dir) == (None, None)


def test_a_default_acl_that_lets_others_read_only_passes(tmp_path):
    """A team's read (r-x), or a named user's rwx whose mask takes the write away: no one else writes."""
    uid, _ = second_user()
    for name, value in (("r", user_entry(uid, 5)), ("masked", user_entry(uid, 7, mask=5)),
                        ("others-read", acl((USER_OBJ, 7, OBJ), (GROUP_OBJ, 5, OBJ), (OTHER, 5, OBJ)))):
        run_dir = tmp_path / name
        run_dir.mkdir(mode=0o755)
        planted(run_dir, value)
        assert _refusal(run_dir) == (None, None), name


def test_a_missing_run_dir_under_a_default_acl_is_refused_before_anything_is_made(tmp_path):
    """run.dir (and a missing directory on the way) made in a directory with such a default ACL gets it as its own:
    refused at the directory it would be made in, by the check and by the walk, which makes nothing."""
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o755)
    planted(runs, other_rwx())
    said = (f"the directory {runs} above it has a default ACL that lets every user write what is made in it, "
            f"whatever the umask says; setfacl -k {runs} (it is yours), or set run.dir to a directory only you")
    for run_dir in (runs / "run", runs / "new" / "run", runs / "new" / ".." / "run"):
        problem, settled = _refusal(run_dir)
        assert problem == settled and problem and said in problem, (run_dir, problem)
    assert os.listdir(runs) == []


def test_an_access_acl_letting_another_user_write_run_dir_is_refused(tmp_path):
    """Already so before the default ACL's rule: the named user's write shows in the mode's group bits (the mask),
    and an ACL counts the group as others (perms.others_can_write)."""
    uid, _ = second_user()
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    planted(run_dir, user_entry(uid, 7), kind="access")
    problem, settled = _refusal(run_dir)
    assert problem == settled and problem and re.search(r"can be written by other users \(mode 775", problem), problem


@pytest.mark.slow
def test_run_check_and_the_launch_refuse_a_run_dir_passing_on_a_default_acl(tmp_path, corpus):
    """End to end: `run --check` and `minilmd run` both exit 2 naming the ACL and its fix, nothing made."""
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o755)
    planted(runs, other_rwx())
    config = write_config(tmp_path, corpus, name="acl", remote=False, run={"dir": str(runs / "run")})
    said = f"the directory {runs} above it has a default ACL that lets every user write what is made in it"
    for args in (("run", "--check", str(config)), ("run", str(config))):
        out = cli(*args, timeout=120)
        assert out.returncode == 2 and said in out.stdout + out.stderr, out.stdout + out.stderr
        assert f"setfacl -k {runs} (it is yours)" in out.stdout + out.stderr
    assert os.listdir(runs) == [] and not load_config(config).scratch_dir.exists()


def test_a_trainers_refusal_of_such_a_run_dir_keeps_its_fix_in_what_the_supervisor_records(tmp_path):
    """A run an older version started whose run.dir has such a default ACL: its next trainer (the new version)
    refuses run.dir, exit 2, and the supervisor records the trainer's last words cut to 400 characters (state.json's
    last error, `status`, supervisor.log: `config error, final: ...`). Before, the fix came after the why, and the
    record ended at "...would be theirs to change); setfacl -k …": what to do was cut away. Now it comes first."""
    import sys

    from minilmd.daemon.child.death import classify
    from minilmd.daemon.child.process import launch

    uid, _ = second_user()
    run_dir = tmp_path / "alice-runs" / "sft-zh-200m-run1"
    run_dir.mkdir(parents=True, mode=0o755)
    planted(run_dir, user_entry(uid, 7))
    problem = run_dir_problem(run_dir)
    assert problem
    code = f"import sys; print('minilmd train: ' + {problem!r}, file=sys.stderr); sys.exit(2)"
    logs = tmp_path / "supervisor-run"  # the supervisor's own run directory for the attempt's log
    logs.mkdir()
    child = launch([sys.executable, "-c", code], logs, 1, devices="")
    death = classify(child, child.popen.wait(60), logs, stop_requested=False)
    assert f"setfacl -k {run_dir} (it is yours)" in death.detail, death.detail


def test_safe_and_common_default_acls_pass(tmp_path):
    """What a user sets on her home or a project directory and lets no one else write: her own named entry (setfacl
    -d -m u:ME:rwx), root's named entry, and the owning group's rwx where that group is hers alone on this local
    disk; each passes before run.dir is made and once it has inherited the ACL."""
    me, group = os.geteuid(), os.getegid()
    if not private_group(group):
        pytest.skip(f"gid {group} is not this user's alone here")
    for name, value in (("own", user_entry(me, 7)), ("root", user_entry(0, 7)),
                        ("own-group", acl((USER_OBJ, 7, OBJ), (GROUP_OBJ, 7, OBJ), (OTHER, 5, OBJ)))):
        home = tmp_path / name
        home.mkdir(mode=0o755)
        planted(home, value)
        assert _refusal(home / "runs" / "run") == (None, None), name
        settle_run_dir(home / "runs" / "run")  # made: it and runs/ inherit the ACL, and pass again as found
        assert _refusal(home / "runs" / "run") == (None, None), name
