"""Hostile audit 4 F3: another user's prepared corpus (`data.prepared`) is trained on by design (docs/failure-modes.md,
"another user's corpus"), but nothing said whose it was: a teammate who swapped a group-shared corpus by name had
his copy staged and trained on without a word. `run --check`, the launch's log (staging) and `status` now name the
owner of a corpus that is not the run's user's, in one note; nothing is refused."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.jobs.staging import stage
from second_user import second_user
from supervisor_helpers import cli, run_supervisor, write_config


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.lchown(Path(folder) / name, uid, gid)
    os.lchown(root, uid, gid)


def test_another_users_corpus_is_named_by_check_the_launch_log_and_status(tmp_path, corpus):
    uid, gid = second_user()
    theirs = tmp_path / "team" / "vprep"
    shutil.copytree(corpus[0], theirs)
    config = write_config(tmp_path, (theirs, corpus[1]), name="r5")
    note = f"data.prepared {theirs} belongs to user nobody (uid {uid})"

    checked = cli("run", "--check", str(config))  # the user's own corpus first: no note
    assert checked.returncode == 0 and "belongs to" not in checked.stdout, checked.stdout + checked.stderr
    logged: list[str] = []
    stage(str(theirs), tmp_path / "shm-own", log=logged.append)
    assert not [line for line in logged if "belongs to" in line], logged

    _chown_tree(theirs, uid, gid)  # the teammate's copy put at the name
    checked = cli("run", "--check", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr  # said, never refused
    [line] = [line for line in checked.stdout.splitlines() if "belongs to" in line]
    assert line.startswith(f"note: {note}: trained on as it is"), line
    logged.clear()
    stage(str(theirs), tmp_path / "shm", log=logged.append)  # what the supervisor logs while it stages
    assert f"staging: note: {note}: trained on as it is (another user's corpus is allowed); check it is the one " \
           "you mean" in logged, logged

    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    shutil.copyfile(config, cfg.run_dir / names.RUN_CONFIG_COPY)
    (cfg.run_dir / names.STATE).write_text(json.dumps(new_state("r5", cfg.run_dir, str(config))))
    shown = cli("status", str(cfg.run_dir))
    assert f"  note: {note}: trained on" in shown.stdout, shown.stdout + shown.stderr


def test_a_file_of_another_user_inside_the_users_own_corpus_is_named(tmp_path, corpus):
    uid, gid = second_user()
    own = tmp_path / "vprep"
    shutil.copytree(corpus[0], own)
    tokens = own / "train" / "tokens.bin"
    os.lchown(tokens, uid, gid)  # a group-shared corpus whose file a teammate replaced
    config = write_config(tmp_path, (own, corpus[1]), name="r6")
    checked = cli("run", "--check", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"note: data.prepared {own} is yours, its train/tokens.bin belongs to user nobody (uid {uid}): " \
           "trained on as it is" in checked.stdout, checked.stdout


@pytest.mark.slow
def test_a_run_on_another_users_corpus_says_so_in_its_log_and_finishes(tmp_path, corpus):
    uid, gid = second_user()
    theirs = tmp_path / "vprep"
    shutil.copytree(corpus[0], theirs)
    _chown_tree(theirs, uid, gid)
    config = write_config(tmp_path, (theirs, corpus[1]), name="r7", train={"max_steps": 10, "checkpoint_every": 10})
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    log = (load_config(config).run_dir / names.SUPERVISOR_LOG).read_text()
    assert f"staging: note: data.prepared {theirs} belongs to user nobody (uid {uid})" in log, log[-3000:]


def test_a_nul_byte_in_a_name_meta_json_lists_is_an_unsafe_name_not_a_traceback(tmp_path, corpus):
    """Review: a name with a NUL byte in meta.json made os.lstat raise ValueError: `status` and `run --check` printed
    a thread's traceback and said the corpus "did not answer within 5 s (stalled)"; staging failed the same way."""
    from minilmd.corpus_meta import CorpusError, listed_files, owner_note

    own = tmp_path / "prep"
    shutil.copytree(corpus[0], own)
    meta = json.loads((own / "meta.json").read_text())
    meta["files"]["train/a\u0000b.bin"] = {"size": 1, "sha256": "0" * 64}
    (own / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CorpusError, match="unsafe file name"):
        listed_files(meta, str(own))
    assert owner_note(str(own)) == ""  # all of it this user's: nothing to say, and no ValueError
    checked = cli("run", "--check", str(write_config(tmp_path, (own, corpus[1]), name="nul")))
    assert "Traceback" not in checked.stdout + checked.stderr and "stalled" not in checked.stdout, checked.stdout
