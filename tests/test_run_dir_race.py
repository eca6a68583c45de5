"""run.dir, and every directory minilmd opens by the place rule, is judged and resolved in one walk
(minilmd/place_rule.py walk_to): a link another user plants on the way after a judgement by path chooses nothing.

The audit's attack, as root (the victim) with nobody (the attacker): run.dir = /tmp/X/race/run with /tmp/X/race
missing (the rule allows it: /tmp is sticky). nobody toggled `race` as a link to her other, finished run's parent:
the launch judged the path while nothing was there, then scratch.claim and the supervisor each resolve()d it through
his link, found root's own directory, and took over her other run (run.toml, state.json rewritten, events appended);
scratch's owner.json kept the run directory he chose, so every later launch was refused until she removed scratch.
Here the link is planted deterministically at the moment it hurt: by a fake check that calls the real one, then
plants it (as nobody). The same hole in Dir.open (a realpath after the judgement by path) and in an output's
directory (mkdir(parents=True) by path through his link, into her private directory) is shown the same way.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minilmd import dirfd, fsio, names, place_rule
from minilmd.config import ConfigError, load_config
from minilmd.daemon import preflight
from minilmd.protocol import SUPERVISOR_CONFIG
from second_user import sh_as_user, shared  # noqa: F401 - shared: a fixture
from supervisor_helpers import write_config

HER_RUN = {names.RUN_CONFIG_COPY: b"name = 'finished'\n", names.STATE: b'{"phase": "done"}\n'}
"""Her other run's files, in a finished run directory of hers the attacker's link points to."""


def _her_other_run(tmp_path: Path) -> Path:
    run = tmp_path / "other" / "run"
    run.mkdir(parents=True)
    for name, body in HER_RUN.items():
        (run / name).write_bytes(body)
    return run


def _files(root: Path) -> dict[str, bytes | str]:
    """Every entry under root (no link followed): a file's bytes, "dir" for a directory."""
    found: dict[str, bytes | str] = {}
    for here, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(here, name)
            found[str(path.relative_to(root))] = "dir" if path.is_dir() else path.read_bytes()
    return found


def _plant_after(monkeypatch, module, name: str, script: str, cwd: Path) -> None:
    """module.name replaced by a fake that calls the real one, then (the first time) runs `script` as nobody in
    `cwd`: the attacker's link appears right after the judgement, the moment his loop hit."""
    real = getattr(module, name)
    planted = []

    def then_plant(*args, **kwargs):
        result = real(*args, **kwargs)
        if not planted:
            sh_as_user(script, cwd=cwd)
            planted.append(script)
        return result

    monkeypatch.setattr(module, name, then_plant)


@pytest.fixture
def umask_kept():
    """preflight.launch sets the process umask (perms.apply): put back after the test."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)


def test_a_link_planted_after_the_check_does_not_take_over_her_other_run(tmp_path, corpus, shared, monkeypatch,
                                                                           umask_kept):
    """Before: the launch returned, scratch's owner.json named her other run, and the supervisor took it over. Now
    the launch's one walk meets his link and refuses it, nothing claimed; once his link is gone the run starts
    there, in a directory of hers that he cannot replace, and the config carries that real path."""
    monkeypatch.delenv(names.SUPERVISOR_RUN_DIR_ENV, raising=False)
    other = _her_other_run(tmp_path)
    config = write_config(tmp_path, corpus, name="raced", remote=False, run={"dir": str(shared / "race" / "run")})
    _plant_after(monkeypatch, preflight, "check_with_waits", f"ln -s {other.parent} race", shared)
    before = _files(other)
    with pytest.raises(ConfigError, match="symbolic link of user nobody"):
        preflight.launch(str(config))
    assert _files(other) == before
    scratch = load_config(config).scratch_dir
    assert not (scratch / names.SCRATCH_OWNER).exists()

    monkeypatch.undo()
    sh_as_user("rm race", cwd=shared)
    cfg, _, _ = preflight.launch(str(config))
    assert cfg.run.dir == str(shared / "race" / "run") and (shared / "race").stat().st_uid == os.getuid()
    assert str(shared / "race" / "run") in (scratch / names.SCRATCH_OWNER).read_text()


def test_the_supervisor_refuses_a_run_dir_through_his_link_and_writes_nothing(tmp_path, corpus, shared):
    """Supervisor.__init__ resolve()d run.dir, then the run judged the resolved path (root's own: passed). Now
    Supervisor.run settles it by the walk: his link is refused, her other run is left as it was."""
    from minilmd.daemon.supervisor import Supervisor

    other = _her_other_run(tmp_path)
    config = write_config(tmp_path, corpus, name="raced-sup", remote=False, run={"dir": str(shared / "race" / "run")},
                          train={"max_steps": 2})
    cfg = load_config(config)
    sh_as_user(f"ln -s {other.parent} race", cwd=shared)
    before = _files(other)
    assert Supervisor(cfg, str(config), echo=False).run() == SUPERVISOR_CONFIG
    assert _files(other) == before


def test_no_directory_is_made_through_his_link_on_the_way_to_an_output(tmp_path, shared, monkeypatch):
    """An output's directory (export's --out): judged by path while `race` was missing, then made by
    mkdir(parents=True) by path and opened by its realpath: both through his link, into her private directory. Now
    the walk that makes it, the one judgement, meets his link, planted after it judged "/": refused, nothing made
    there."""
    hers = tmp_path / "hers"
    hers.mkdir(mode=0o700)
    _plant_after(monkeypatch, place_rule, "_judged", f"ln -s {hers} race", shared)
    with pytest.raises(place_rule.PlaceRefused, match="symbolic link"):
        fsio.write_out_text(shared / "race" / "sub" / "out.txt", "x", "--out", "the output", "choose another")
    assert list(hers.iterdir()) == []


def test_prepare_makes_nothing_through_his_link_on_the_way_to_out(tmp_path, shared, monkeypatch, demo_jsonl,
                                                                 tokenizer):
    """prepare --out: judged while `race` was missing (check_out_place), then its missing directories made by path
    and its directory opened by realpath, both through his link: the corpus went into her private directory. Now
    the walk that makes them meets his link, planted after the check: refused, nothing made there."""
    from data_helpers import run_prepare
    from minilmd.corpus.prepare import lock

    hers = tmp_path / "hers"
    hers.mkdir(mode=0o700)
    _plant_after(monkeypatch, lock, "walk_problem", f"ln -s {hers} race", shared)
    with pytest.raises(ValueError, match="symbolic link"):
        run_prepare(demo_jsonl[:1], tokenizer, shared / "race" / "sub" / "corpus", val_fraction=0.1)
    assert list(hers.iterdir()) == []


def test_dir_open_follows_no_link_planted_after_its_judgement(tmp_path, shared, monkeypatch):
    """Dir.open (scratch, a run.remote): once a judgement by path, then a realpath that followed whatever link stood
    there by then, then a walk of that real path. Now the walk is the one judgement, and meets the link planted
    after it judged the first directory ("/")."""
    hers = tmp_path / "hers"
    hers.mkdir(mode=0o700)
    _plant_after(monkeypatch, place_rule, "_judged", f"mkdir race && ln -s {hers} race/in", shared)
    with pytest.raises(place_rule.PlaceRefused):
        dirfd.Dir.open(shared / "race" / "in", "the test's directory")


def test_settle_follows_her_own_links_and_makes_what_is_missing(tmp_path):
    """Legitimate flows: ~/runs a link of hers to /data/runs (absolute), a relative link with `..`, missing
    directories made by the walk; the real path returned is what realpath says once they exist."""
    data = tmp_path / "data"
    (data / "runs").mkdir(parents=True)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "runs").symlink_to(data / "runs")
    (tmp_path / "home" / "up").symlink_to("../data/./runs")
    for given in (tmp_path / "home" / "runs" / "a" / "run", tmp_path / "home" / "up" / "b" / "run"):
        real = place_rule.settle_run_dir(given)
        assert real.is_dir() and real == Path(os.path.realpath(given)) and real.parent.parent == data / "runs"
    assert place_rule.settle_run_dir(data / "runs" / "a" / "run") == data / "runs" / "a" / "run"  # a restart
    through = tmp_path / "home" / "runs" / ".." / "c"  # `..` after a link: up from where it leads, as the kernel
    assert place_rule.settle_run_dir(through) == data / "c" == Path(os.path.realpath(through))


def test_settle_refuses_a_loop_of_links(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(place_rule.PlaceRefused, match="more than 40 symbolic links"):
        place_rule.settle_run_dir(tmp_path / "a" / "run")
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_a_run_dir_through_her_own_link_launches_at_its_real_path(tmp_path, corpus, monkeypatch, umask_kept):
    """~/runs a link of hers to /data/runs: the launch passes, the config and scratch's owner record carry the real
    path, which is what `minilmd run` carried as its identity (procs.carry_supervisor_identity resolves it)."""
    data = tmp_path / "data" / "runs"
    data.mkdir(parents=True)
    (tmp_path / "runs").symlink_to(data)
    config = write_config(tmp_path, corpus, name="linked", remote=False, run={"dir": str(tmp_path / "runs" / "x")})
    monkeypatch.setenv(names.SUPERVISOR_RUN_DIR_ENV, str((tmp_path / "runs" / "x").resolve()))
    cfg, _, _ = preflight.launch(str(config))
    assert cfg.run.dir == str(data / "x") and (data / "x").is_dir()
    assert f'"run_dir": "{data / "x"}"' in (cfg.scratch_dir / names.SCRATCH_OWNER).read_text()


def test_a_run_dir_that_leads_elsewhere_than_when_the_command_started_is_refused(tmp_path, corpus, monkeypatch,
                                                                                 umask_kept):
    """`minilmd run` carries the run directory it resolved at its start (for `stop`'s proof); a link on the way
    that moved before the launch's walk would leave the supervisor named for another run directory: refused."""
    config = write_config(tmp_path, corpus, name="moved", remote=False)
    monkeypatch.setenv(names.SUPERVISOR_RUN_DIR_ENV, str(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError, match="a link on the way changed"):
        preflight.launch(str(config))
    assert not (load_config(config).scratch_dir / names.SCRATCH_OWNER).exists()


def test_minilmd_train_on_its_own_makes_nothing_through_his_link(tmp_path, corpus, shared):
    """make_run_dir made run.dir by mkdir(parents=True) by path, then judged it: through his link at a missing
    `race`, the directories appeared in her private directory before the refusal. Now the walk refuses first."""
    from minilmd.trainer.loop.entry import main

    hers = tmp_path / "hers"
    hers.mkdir(mode=0o700)
    config = write_config(tmp_path, corpus, name="raced-train", remote=False,
                          run={"dir": str(shared / "race" / "new" / "run")})
    sh_as_user(f"ln -s {hers} race", cwd=shared)
    assert main(str(config)) == SUPERVISOR_CONFIG
    assert list(hers.iterdir()) == []


def test_minilmd_train_claims_no_scratch_for_her_other_run_through_his_link(tmp_path, corpus, shared, monkeypatch,
                                                                           capfd):
    """`minilmd train` on its own claimed scratch (scratch.claim resolve()s run.dir by path) before run() settled
    run.dir by the walk: his link planted right after the config was read made owner.json name her other run, the
    walk then refused (exit 2), and her later launch was refused ("belongs to another run"). Now main() settles
    run.dir first: refused, scratch not claimed, her other run untouched."""
    from minilmd.trainer.loop import entry

    monkeypatch.delenv(names.RUN_DIR_ENV, raising=False)
    other = _her_other_run(tmp_path)
    config = write_config(tmp_path, corpus, name="raced-train-main", remote=False,
                          run={"dir": str(shared / "race" / "run")})
    _plant_after(monkeypatch, entry, "load_checked", f"ln -s {other.parent} race", shared)
    before = _files(other)
    assert entry.main(str(config)) == SUPERVISOR_CONFIG
    assert "symbolic link of user nobody" in capfd.readouterr().err
    assert not (load_config(config).scratch_dir / names.SCRATCH_OWNER).exists()
    assert _files(other) == before


def test_the_demo_makes_nothing_through_his_link_planted_after_its_judgement(tmp_path, shared, monkeypatch):
    """The demo directory: judged by path (place_problem, now the walk's judgement, walk_problem), then resolve()d
    and its parent made by path, both through his link planted meanwhile: fresh_start made sub/demo-run/.minilmd-demo
    in her private directory. Now the walk that makes it meets his link: refused, nothing made there."""
    from minilmd.daemon import demo

    hers = tmp_path / "hers"
    hers.mkdir(mode=0o700)
    _plant_after(monkeypatch, demo, "walk_problem", f"ln -s {hers} race", shared)
    with pytest.raises(SystemExit, match="symbolic link of user nobody.*nothing was removed"):
        demo.fresh_start(shared / "race" / "sub" / "demo-run")
    assert list(hers.iterdir()) == []


def test_the_demo_goes_on_at_the_real_path_its_walk_made(tmp_path):
    """A demo directory through her own link, its parent missing: made by the walk, and its real path returned."""
    from minilmd.daemon import demo

    (tmp_path / "data").mkdir()
    (tmp_path / "mine").symlink_to(tmp_path / "data")
    real, _ = demo.fresh_start(tmp_path / "mine" / "sub" / "demo-run")
    assert real == tmp_path / "data" / "sub" / "demo-run" and (real / ".minilmd-demo").is_file()


def test_an_output_directory_is_made_nowhere_through_his_link(tmp_path, shared, monkeypatch):
    """demo-corpus's OUT (fsio.open_out_dir): judged by path, then its missing directories made by path through his
    link planted meanwhile (`sub` appeared in her private directory) before Dir.open refused. Now one walk judges,
    makes and opens it: refused at his link, planted after it judged "/", nothing made there."""
    hers = tmp_path / "hers"
    hers.mkdir(mode=0o700)
    _plant_after(monkeypatch, place_rule, "_judged", f"ln -s {hers} race", shared)
    with pytest.raises(place_rule.PlaceRefused, match="symbolic link of user nobody"):
        fsio.open_out_dir(shared / "race" / "sub" / "out", "OUT", "the corpus", "choose another")
    assert list(hers.iterdir()) == []


def test_a_run_dir_made_under_umask_002_with_a_shared_primary_group_is_not_refused_as_made(shared):
    """A user whose primary group others are in (nobody's nogroup here; a cluster's `users`) and whose umask is 002:
    settle_run_dir made her missing run.dir 0775 (0777 less the umask), then the place rule it judges it by right
    after refused it as writable by other users. `minilmd run` and `train` set run.share's umask first, which has no
    group write; settle_run_dir itself now makes it without group or other write, whatever the umask."""
    import subprocess

    from second_user import user_python

    mine = shared / "hers"
    settle = user_python("import os, sys\nos.umask(0o002)\nfrom minilmd import place_rule\n"
                         "os.mkdir(sys.argv[1], 0o755)\n"
                         "print(place_rule.settle_run_dir(os.path.join(sys.argv[1], 'a', 'run')))\n", str(mine))
    done = subprocess.run(settle, capture_output=True, text=True, cwd="/", timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(mine / "a" / "run")
    for made in (mine / "a", mine / "a" / "run"):
        assert os.stat(made).st_mode & 0o777 == 0o755, oct(os.stat(made).st_mode)
