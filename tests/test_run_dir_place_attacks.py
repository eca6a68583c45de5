"""run.dir is held to the place rule (minilmd/place_rule.py run_dir_problem): another user cannot choose where a run's
files go. Both attacks were reproduced on the code before it, as root (the victim) with nobody (the attacker):

A. nobody makes /tmp/.../x/run (0777, his) holding `.space-reserve`, `events.jsonl` and `supervisor.log` as links to
   her files: `minilmd run` started without objection, zeroed her precious.txt (262144 bytes) and appended events to
   her notes;
B. nobody owns /tmp/.../y and makes `run` a link to her other, private run directory: the supervisor took it over
   (its run.toml and state.json replaced, the registry recording it).

Now `run --check` and the launch refuse both, exit 2, naming the directory and its owner, nothing written; and
`minilmd train` on its own refuses a run.dir another user can rearrange. Behind the rule, the two writes that
truncate or append to an existing file in run.dir follow no link and block on no FIFO, and the trainer reads
state.json as untrusted (a FIFO there no hang).
"""
from __future__ import annotations

import errno
import os
import pwd
import re
import subprocess
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import EventLog
from minilmd.daemon.phases.rundirwatch import RESERVE_BYTES, make_reserve, release_reserve
from minilmd.place_rule import PlaceRefused, open_run_dir, run_dir_problem, settle_run_dir
from minilmd.protocol import SUPERVISOR_CONFIG
from minilmd.trainer.loop.tensorboard import restarts_so_far
from real_groups import groups  # noqa: F401 - a fixture
from second_user import second_user, sh_as_user, shared, user_python  # noqa: F401 - shared: a fixture
from supervisor_helpers import cli, write_config
from trainer_corpus import train_cmd
from waiting import without_blocking

HERS = {"precious.txt": b"her thesis, chapter 3\n" * 40, "notes.txt": b"her notes\n", "log.txt": b"her log\n"}
"""The victim's own files, in her private (pytest's 0700) directory, that the attacker's links point to."""


def _her_files(home: Path) -> dict[Path, bytes]:
    home.mkdir()
    made = {home / name: body for name, body in HERS.items()}
    for path, body in made.items():
        path.write_bytes(body)
    return made


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under root (no link followed): a file's bytes, a link's target, "dir" for a directory."""
    found: dict[str, bytes | str] = {}
    for here, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(here, name)
            rel = str(path.relative_to(root))
            found[rel] = (f"-> {os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir()
                          else path.read_bytes())
    return found


def _refused_by_check_and_launch(config: Path, *fragments: str) -> str:
    """`minilmd run --check CONFIG` and `minilmd run CONFIG` (the fake trainer behind it: a launch past the checks
    trains) both exit 2, naming every fragment, without a traceback; the launch's text."""
    texts = []
    for args in (("run", "--check", str(config)), ("run", str(config))):
        out = cli(*args, timeout=120)
        text = out.stdout + out.stderr
        assert out.returncode == SUPERVISOR_CONFIG, text
        assert all(f in text for f in fragments), f"missing one of {fragments} in:\n{text}"
        assert "Traceback" not in text
        texts.append(text)
    return texts[1]


def _registered(run_name: str) -> list[str]:
    runs = Path(os.environ["XDG_STATE_HOME"]) / "minilmd" / "runs"
    return sorted(p.name for p in runs.glob(f"{run_name}-*")) if runs.is_dir() else []


@pytest.mark.slow
def test_a_run_dir_of_another_user_full_of_links_to_her_files_is_refused_and_nothing_written(
        tmp_path, corpus, shared):
    """Attack A: his 0777 run directory in his directory, its reserve, events and log links to her files."""
    hers = _her_files(tmp_path / "her")
    precious, notes, log = (tmp_path / "her" / n for n in HERS)
    sh_as_user(f"mkdir -m 755 x && mkdir -m 777 x/run && chmod 777 x/run && "
               f"ln -s {precious} x/run/{names.RUN_DIR_RESERVE} && ln -s {notes} x/run/{names.EVENTS} && "
               f"ln -s {log} x/run/{names.SUPERVISOR_LOG}", cwd=shared)
    his_run = shared / "x" / "run"
    planted = _tree(shared)
    config = write_config(tmp_path, corpus, name="lured", remote=False, run={"dir": str(his_run)})

    _refused_by_check_and_launch(config, f"run.dir {his_run}: the directory {shared / 'x'} above it belongs to "
                                         f"user nobody", "set run.dir to a directory only you (and root) can change")
    assert {path: path.read_bytes() for path in hers} == hers  # her thesis not zeroed, no event in her notes
    assert _tree(shared) == planted  # nothing made or written in his directory
    assert not load_config(config).scratch_dir.exists()  # refused before scratch was claimed
    assert _registered("lured") == []


@pytest.mark.slow
def test_a_run_dir_that_is_his_link_to_her_other_run_is_refused_and_that_run_left_whole(tmp_path, corpus, shared):
    """Attack B: he owns the directory above run.dir and makes `run` a link to her private run directory."""
    other = tmp_path / "her-other-run"
    other.mkdir(mode=0o700)
    (other / names.RUN_CONFIG_COPY).write_text("[run]\nname = \"other\"\n")
    (other / names.STATE).write_text('{"phase": "done"}')
    (other / "precious.txt").write_bytes(HERS["precious.txt"])
    before = _tree(other)
    sh_as_user(f"mkdir -m 755 y && ln -s {other} y/run", cwd=shared)
    config = write_config(tmp_path, corpus, name="taken", remote=False, run={"dir": str(shared / "y" / "run")})

    _refused_by_check_and_launch(config, f"the directory {shared / 'y'} above it belongs to user nobody")
    assert _tree(other) == before  # her run's config and state not replaced, no lock, no events
    assert _registered("taken") == []


@pytest.mark.slow
def test_a_run_dir_under_a_directory_anyone_may_write_is_refused_by_check_launch_and_train(tmp_path, corpus):
    """One's own directory left 0777 (not sticky): anyone could replace run.dir. Refused with the chmod that
    fixes it, by `run --check`, the launch and `minilmd train` alike, nothing made; after the chmod it is used."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    run_dir = open_dir / "run"
    config = write_config(tmp_path, corpus, name="open", remote=False, run={"dir": str(run_dir)})
    said = f"run.dir {run_dir}: the directory {open_dir} above it can be written by other users (mode 777"

    _refused_by_check_and_launch(config, said, f"; chmod go-w {open_dir} (it is yours), or set run.dir")
    trained = cli(*train_cmd(config)[3:], timeout=300)
    assert trained.returncode == 2 and said in trained.stderr, trained.stdout + trained.stderr
    assert not run_dir.exists() and not load_config(config).scratch_dir.exists()

    open_dir.chmod(0o755)  # what the advice says
    checked = cli("run", "--check", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_refused_directory_of_ones_own_leads_with_chmod_and_no_home_advice_under_home(tmp_path, monkeypatch):
    """One's own directory others can write (0775 under umask 002 on a share where a private group cannot be
    judged; 0777 here): the fix is a chmod, said first; and "under your home" is no advice for a run.dir in it."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    monkeypatch.setenv("HOME", str(tmp_path))
    problem = run_dir_problem(open_dir / "run")
    assert problem is not None
    fix = problem.partition("; ")[2]
    assert fix.startswith(f"chmod go-w {open_dir} (it is yours), or set run.dir to a directory only you"), problem
    assert "home" not in problem, problem
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    problem = run_dir_problem(open_dir / "run")
    assert problem is not None and "such as one under your home" in problem, problem
    assert problem.partition("; ")[2].startswith(f"chmod go-w {open_dir} (it is yours), or "), problem


# --- behind the rule: no write through a link, no FIFO waited on --------------------------------------------------

def test_the_reserve_is_never_written_through_a_link_nor_into_a_fifo(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_bytes(HERS["precious.txt"])
    reserve = run_dir / names.RUN_DIR_RESERVE
    reserve.symlink_to(precious)
    with pytest.raises(OSError):
        make_reserve(run_dir)
    assert precious.read_bytes() == HERS["precious.txt"]

    reserve.unlink()
    os.mkfifo(reserve)
    with pytest.raises(OSError):
        without_blocking(lambda: make_reserve(run_dir), reserve)

    reserve.unlink()
    assert make_reserve(run_dir) and reserve.read_bytes() == bytes(RESERVE_BYTES)  # a real one is made


@pytest.mark.root
def test_a_reserve_another_uid_owns_is_neither_refused_nor_written_nor_removed(tmp_path):
    """A file at the reserve's name that another user owns (an admin's, in the run's own run.dir; another user's
    made while run.dir was open to others, before the chmod go-w the place rule asks for) is no reason to stop the
    supervisor's start with exit 1 (review2 F5: a refusal that a restart meets again, for ever), and not the run's
    to write or remove: before, its bytes were zeroed to the reserve's size and, when run.dir filled, it was
    unlinked. Now it is left as it is, and the run goes without a reserve."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    reserve = run_dir / names.RUN_DIR_RESERVE
    reserve.write_bytes(b"his")
    os.chown(reserve, 65534, 65534)
    reserve.chmod(0o666)
    assert make_reserve(run_dir) and reserve.read_bytes() == b"his"
    assert not release_reserve(run_dir) and reserve.read_bytes() == b"his"
    reserve.unlink()
    assert make_reserve(run_dir) and reserve.read_bytes() == bytes(RESERVE_BYTES)  # a reserve of the run's own
    assert release_reserve(run_dir) and not reserve.exists()


def test_a_reserve_removed_as_it_is_made_tests_the_room_all_the_same(tmp_path, monkeypatch):
    """An `rm` of the reserve (or of run.dir) between its open and its check leaves a file with no link: no other
    file's body (lockfile.problem, the one rule), so its zeros are written and the room is said there, and the next
    making puts one at its name; before, an OSError ("not a regular file of one link"), which the supervisor's start
    does not catch."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    reserve, real_open = run_dir / names.RUN_DIR_RESERVE, os.open

    def open_then_removed(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if path == names.RUN_DIR_RESERVE and os.path.samestat(os.fstat(kwargs["dir_fd"]), os.stat(run_dir)):
            os.unlink(path, dir_fd=kwargs["dir_fd"])  # opened relative to run.dir's descriptor (Dir.open_or_make)
        return fd

    monkeypatch.setattr(os, "open", open_then_removed)
    assert make_reserve(run_dir) and not reserve.exists()
    monkeypatch.undo()
    assert make_reserve(run_dir) and reserve.read_bytes() == bytes(RESERVE_BYTES)


def test_a_reserve_cut_by_a_full_disk_is_removed_only_while_its_name_leads_to_it(tmp_path, monkeypatch):
    """On ENOSPC the half-written reserve is removed, relative to run.dir's checked descriptor and only while the
    name still leads to the file written (Dir.remove_file): a file put at the name meanwhile is left. Before, the
    reserve's name was unlinked by path, whatever it led to then."""
    from minilmd.daemon.phases import rundirwatch
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    reserve, kept = run_dir / names.RUN_DIR_RESERVE, b"the user's file, moved to the reserve's name\n"

    def full(fd: int, size: int) -> None:
        os.write(fd, bytes(4096))  # a part, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def swapped_then_full(fd: int, size: int) -> None:
        os.rename(reserve, run_dir / "reserve-moved-away")
        (run_dir / "hers").write_bytes(kept)
        os.rename(run_dir / "hers", reserve)
        full(fd, size)

    monkeypatch.setattr(rundirwatch, "_write_zeros", full)
    assert make_reserve(run_dir) is False and not reserve.exists()  # the half-written reserve: gone
    monkeypatch.setattr(rundirwatch, "_write_zeros", swapped_then_full)
    assert make_reserve(run_dir) is False
    assert reserve.read_bytes() == kept  # before: unlinked
    assert (run_dir / "reserve-moved-away").stat().st_size == 4096  # the reserve written, under its new name


def test_a_reserve_given_up_is_removed_only_while_its_name_leads_to_the_file_looked_at(tmp_path, monkeypatch):
    """release_reserve looks at the reserve's name (a regular file of ours?) and removes it through run.dir's checked
    descriptor only while the name still leads to that file (Dir.remove_file, as make_reserve's removal on ENOSPC):
    a file put at the name between the look and the removal is left. Before, the name was unlinked by path after
    the look, whatever it led to by then."""
    from minilmd.daemon.phases import rundirwatch
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    reserve, kept = run_dir / names.RUN_DIR_RESERVE, b"the user's file, moved to the reserve's name\n"
    assert make_reserve(run_dir)
    real_owned = rundirwatch.owned_by_me

    def looked_at_then_swapped(st: os.stat_result) -> bool:
        os.rename(reserve, run_dir / "reserve-moved-away")
        (run_dir / "hers").write_bytes(kept)
        os.rename(run_dir / "hers", reserve)
        return real_owned(st)

    monkeypatch.setattr(rundirwatch, "owned_by_me", looked_at_then_swapped)
    assert release_reserve(run_dir) is False
    assert reserve.read_bytes() == kept  # before: unlinked
    monkeypatch.undo()
    (run_dir / "reserve-moved-away").unlink()
    reserve.unlink()
    assert make_reserve(run_dir) and release_reserve(run_dir) and not reserve.exists()  # the reserve itself: given up
    assert release_reserve(run_dir) is False  # none there now


@pytest.mark.parametrize("name", [names.EVENTS, names.SUPERVISOR_LOG])
def test_events_are_never_appended_through_a_link(tmp_path, name):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    notes = tmp_path / "notes.txt"
    notes.write_bytes(HERS["notes.txt"])
    (run_dir / name).symlink_to(notes)
    with pytest.raises(OSError):
        EventLog(run_dir, echo=False).emit("start", "supervisor pid 1 owns the run")
    assert notes.read_bytes() == HERS["notes.txt"]


def test_the_trainer_reads_a_fifo_at_state_json_as_no_restarts_without_waiting(tmp_path, corpus):
    cfg = load_config(write_config(tmp_path, corpus, name="tb", remote=False))
    cfg.run_dir.mkdir(parents=True)
    os.mkfifo(cfg.run_dir / names.STATE)
    assert without_blocking(lambda: restarts_so_far(cfg), cfg.run_dir / names.STATE) == 0


def test_a_run_dir_another_user_makes_between_the_check_and_the_start_gets_nothing_written(tmp_path, corpus, shared):
    """The race the check alone left: run.dir did not exist when the launch judged it; he made it (0777, his) with a
    `logs` link to her private directory before the supervisor made it (he waits for the scratch to appear). Before,
    the supervisor wrote its lock, state and events into his directory and its attempt log through his link. Now
    run.dir is judged again once made (place_rule.make_run_dir): exit 2, nothing written, in either directory."""
    from minilmd.daemon.supervisor import Supervisor

    private = tmp_path / "her-private"
    private.mkdir(mode=0o700)
    late = shared / "late"
    config = write_config(tmp_path, corpus, name="raced", remote=False, run={"dir": str(late)})
    cfg = load_config(config)
    assert run_dir_problem(cfg.run_dir) is None  # what the launch saw: nothing there yet
    sh_as_user(f"mkdir -m 777 late && chmod 777 late && ln -s {private} late/{names.ATTEMPT_LOGS}", cwd=shared)
    planted = _tree(shared)
    assert Supervisor(cfg, str(config), echo=False).run() == SUPERVISOR_CONFIG
    assert _tree(shared) == planted and list(private.iterdir()) == []


def test_the_trainer_on_its_own_judges_the_run_dir_it_makes_again(tmp_path, corpus, shared):
    from minilmd.trainer.loop.entry import main

    late = shared / "late-train"
    config = write_config(tmp_path, corpus, name="raced-train", remote=False, run={"dir": str(late)})
    sh_as_user("mkdir -m 777 late-train && chmod 777 late-train", cwd=shared)
    assert main(str(config)) == SUPERVISOR_CONFIG and os.listdir(late) == []


# --- run.dir itself: no one else may add to it, sticky or not -------------------------------------------------------

@pytest.mark.slow
def test_a_sticky_run_dir_anyone_may_write_is_refused_by_check_launch_and_train(tmp_path, corpus, shared):
    """run.dir itself 1777 (hers, like /tmp): the sticky bit keeps others from removing or renaming its files, not
    from making them first. Before, `run --check` passed it (the sticky exception of the directories above covered
    run.dir too), and nobody's own events.jsonl (0666, his to read and rewrite) and `logs` directory made there
    before the run were the run's event log and attempt logs. Now refused by `run --check`, the launch and `minilmd
    train`, exit 2, with the chmod that fixes it, nothing written; after the chmod it is used."""
    run_dir = shared / "run"
    run_dir.mkdir()
    run_dir.chmod(0o1777)
    sh_as_user(f"echo his > run/{names.EVENTS} && chmod 666 run/{names.EVENTS} && "
               f"mkdir -m 777 run/{names.ATTEMPT_LOGS}", cwd=shared)
    planted = _tree(shared)
    config = write_config(tmp_path, corpus, name="sticky", remote=False, run={"dir": str(run_dir)})
    said = (f"run.dir {run_dir}: the directory {run_dir} can be written by other users (mode 1777: sticky, which "
            f"keeps them from removing or renaming its files, not from making them first)")

    _refused_by_check_and_launch(config, said, f"; chmod go-w {run_dir} (it is yours), or set run.dir")
    trained = cli(*train_cmd(config)[3:], timeout=300)
    assert trained.returncode == 2 and said in trained.stderr, trained.stdout + trained.stderr
    assert _tree(shared) == planted  # his events.jsonl not appended to, nothing made in his logs
    assert not load_config(config).scratch_dir.exists()  # refused before scratch was claimed
    assert _registered("sticky") == []

    run_dir.chmod(0o755)  # what the advice says
    checked = cli("run", "--check", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_sticky_run_dir_of_roots_anyone_may_write_is_refused_for_another_user(shared):
    """A root-owned 1777 run.dir (as /tmp itself would be) judged by a user who is not root: refused as well, the
    advice being another directory (it is not hers to chmod). The sticky directory above it (`shared`, root's 1777,
    as /tmp) stays fine: a run.dir of hers made in it is accepted."""
    (shared / "roots").mkdir()
    (shared / "roots").chmod(0o1777)
    sh_as_user("mkdir -m 755 hers", cwd=shared)
    code = ("import sys\nfrom minilmd.place_rule import run_dir_problem\n"
            "for path in sys.argv[1:]: print(run_dir_problem(path))\n")
    done = subprocess.run(user_python(code, str(shared / "roots"), str(shared / "hers"), str(shared / "new")),
                          capture_output=True, text=True, cwd="/", timeout=60)
    assert done.returncode == 0, done.stderr
    roots, hers, new = done.stdout.splitlines()
    assert roots.startswith(f"run.dir {shared / 'roots'}: the directory {shared / 'roots'} can be written by other "
                            f"users (mode 1777: sticky, "), roots
    assert "chmod" not in roots and "set run.dir to a directory only you" in roots, roots
    assert hers == "None" and new == "None"


def test_a_run_dir_only_its_owners_private_group_may_write_is_accepted(tmp_path, groups):
    """Others who can write run.dir are refused whatever the sticky bit; a group of this user's alone is not
    others (perms.private_group, as for every directory of the rule: a real group made for the test): 0775 and
    1775 pass there, 1777 does not, nor 1775 in a group another user is in."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chown(run_dir, -1, groups.group(members=(me,)))
    for mode in (0o775, 0o1775):
        run_dir.chmod(mode)
        assert run_dir_problem(run_dir) is None, oct(mode)
    run_dir.chmod(0o1777)
    assert "can be written by other users (mode 1777: sticky" in (run_dir_problem(run_dir) or "")
    second_user()
    os.chown(run_dir, -1, groups.group(members=(me, "nobody")))
    run_dir.chmod(0o1775)
    assert "can be written by other users (mode 1775: sticky" in (run_dir_problem(run_dir) or "")


def test_the_walk_that_settles_run_dir_refuses_a_sticky_one_others_may_write(tmp_path):
    """The same rule where run.dir is made and opened (place_rule.settle_run_dir: the supervisor's start and
    `minilmd train`; open_run_dir: the run lock), judged on its descriptor: a run.dir made 1777 after `run --check`
    is refused there too; and reached through a link of one's own (followed, as ever) it is judged where it leads."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o1777)
    said = f"the directory {run_dir} can be written by other users (mode 1777: sticky, "
    with pytest.raises(PlaceRefused, match=re.escape(said)):
        settle_run_dir(run_dir)
    with pytest.raises(PlaceRefused, match=re.escape(said)):
        os.close(open_run_dir(run_dir))
    (tmp_path / "link").symlink_to(run_dir)
    assert said in (run_dir_problem(tmp_path / "link") or "")
    with pytest.raises(PlaceRefused, match=re.escape(said)):
        settle_run_dir(tmp_path / "link")
    run_dir.chmod(0o1755)  # sticky, but no one else may write: fine
    assert run_dir_problem(tmp_path / "link") is None and settle_run_dir(tmp_path / "link") == run_dir


def test_a_run_dir_ending_in_dot_dot_after_a_link_is_judged_where_the_walk_ends(tmp_path):
    """`~/link/..` with her link to a directory in a sticky one others may write (/tmp/x): the kernel, and the walk,
    end at /tmp, abspath at `~`. The walk judged /tmp as it passed it, by the rule of the directories above (a sticky
    one of root's is fine there), and ended on it at the "..": settle_run_dir gave /tmp as run.dir, the rule's
    `closed` never asked. Now the directory a walk ends on at a ".." is judged again as the target."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "sub").mkdir()
    home = tmp_path / "home"
    home.mkdir()
    (home / "link").symlink_to(sticky / "sub")
    said = f"the directory {sticky} can be written by other users (mode 1777: sticky, "
    with pytest.raises(PlaceRefused, match=re.escape(said)):
        settle_run_dir(home / "link" / "..")
    with pytest.raises(PlaceRefused, match=re.escape(said)):
        os.close(open_run_dir(home / "link" / ".."))
    assert settle_run_dir(home / "link" / ".." / "sub") == sticky / "sub"  # passed through, not ended on: fine
    assert settle_run_dir(home / "link" / ".." / ".." / "home") == home


def _dot_dot_places(tmp_path: Path) -> tuple[Path, Path]:
    """(her home, a directory in a sticky one others may write): her `link` in her home leads to `sticky/sub`."""
    sticky = tmp_path / "sticky"
    (sticky / "sub").mkdir(parents=True)
    sticky.chmod(0o1777)
    home = tmp_path / "home"
    home.mkdir()
    (home / "link").symlink_to(sticky / "sub")
    return home, sticky


def test_run_dir_problem_answers_as_the_walk_that_makes_run_dir_for_every_spelling(tmp_path):
    """run --check's rule (run_dir_problem) and the launch's walk (settle_run_dir) give one answer, in one set of
    words, however run.dir is spelled: ".." after a link goes up from where the link leads, as in the kernel, and
    ".." after a directory not there yet back to the one it is made in. Before, run_dir_problem judged by path,
    abspath reading `~/link/..` as `~`: passed by the check, refused by the launch."""
    home, sticky = _dot_dot_places(tmp_path)
    spellings = [home / "link" / "..", home / "link" / ".." / "sub", home / "link" / ".." / "..",
                 home / "missing" / "..", home / "missing" / ".." / ".." / "sticky", home / "new" / "run", sticky,
                 home / "." / "link" / ".." / "." / "sub" / "deeper"]
    for spelling in spellings:
        problem = run_dir_problem(spelling)
        try:
            settled: str | None = None
            settle_run_dir(spelling)
        except PlaceRefused as e:
            settled = str(e)
        assert (problem, spelling) == (settled and settled.removesuffix(" (found so when opened)"), spelling)
    assert run_dir_problem(home / "link" / "..") is not None  # the case the two answered differently


@pytest.mark.slow
def test_run_check_refuses_dot_dot_after_a_link_as_the_launch_does(tmp_path, corpus):
    """`run.dir = ~/link/..`, her link to a directory in a sticky one others may write: `run --check` passed it
    (exit 0: it judged `~`) where the launch refused it (exit 2, nothing made: its walk ends in the sticky one).
    Both refuse it now, naming the directory the walk ends at, nothing made."""
    home, sticky = _dot_dot_places(tmp_path)
    config = write_config(tmp_path, corpus, name="updown", remote=False, run={"dir": str(home / "link" / "..")})
    said = (f"the directory {sticky} can be written by other users (mode 1777: sticky, which keeps them from "
            f"removing or renaming its files, not from making them first)")
    _refused_by_check_and_launch(config, said, f"chmod go-w {sticky} (it is yours)")
    assert sorted(os.listdir(sticky)) == ["sub"] and os.listdir(sticky / "sub") == []
    assert not load_config(config).scratch_dir.exists() and _registered("updown") == []
