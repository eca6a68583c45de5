"""A checkpoint another user put at a path the victim names (audit 11 F2), with a real second user (nobody) as the
teammate: init.from and export say whose it is, and refuse a copy of his that claims to be one of her runs
(minilmd/source_owner.py).

Reproduced on main 9102057: the teammate renamed the team directory holding the victim's run.remote away, made his
own (0777) in its place and copied her step directory there with his weights, its manifest rehashed.
`run --check` with that root as init.from passed without a word and `export` exported his weights in silence,
where her own run refused that remote. A teammate's genuine checkpoint (its trainer_state.json naming his run
directory) is still loaded, and said with its owner and the team directory above it others can write; a corpus in
such a team directory is said by the same rule.

A trainer_state.json of the squash uid (nobody's, as an NFS share with all_squash gives every file, the user's own
synced checkpoint's too) proves no other user wrote it: such a claim is loaded, said as one whose writer cannot be
told (before: her own run's checkpoint there was refused as a teammate's copy); one of a real other uid is refused.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minilmd import names
from minilmd.cli import app
from minilmd.config import load_config
from minilmd.corpus_meta import owner_note
from minilmd.init_source import InitSourceError, resolve
from second_user import chown_tree, second_user, shared, team  # noqa: F401 - shared, team: fixtures
from trainer_corpus import write_config

pytestmark = pytest.mark.root
STEP = "step-00000300"
CLAIM = "a copy claiming to be your run's checkpoint"
TEAMMATE_UID = 4242
"""A real other user's uid for the copy's trainer_state.json: not nobody, whose files prove no writer."""
SQUASHED = "the share's squash uid (or a user namespace's unmapped owner): who wrote it cannot be told"


def _stage(tmp_path: Path, corpus, init_from: Path) -> Path:
    return write_config(tmp_path, corpus, name="s", init={"from": str(init_from)})


def _checkpoint_root(root: Path, config: Path, corpus_dir: Path, run_dir: Path, state_uid: int | None = None) -> Path:
    """A checkpoint root (LATEST -> step-00000300) whose trainer_state.json records the model of `config` and
    `run_dir` as its run's directory, then given to the second user with `root` and the directory above it 0777 (as
    he makes them); its trainer_state.json then to `state_uid` where one is given."""
    meta = json.loads((corpus_dir / "meta.json").read_text(encoding="utf-8"))
    run_cfg = load_config(config).to_dict()
    run_cfg["run"]["dir"] = str(run_dir)
    ckpt = root / STEP
    ckpt.mkdir(parents=True)
    state = {"step": 300, "config": run_cfg, "fingerprints": {"data": "d" * 64, "tokenizer": meta["tokenizer_sha256"]}}
    (ckpt / names.TRAINER_STATE).write_text(json.dumps(state), encoding="utf-8")
    (ckpt / names.MANIFEST).write_text(json.dumps({"step": 300, "files": {}}), encoding="utf-8")
    (root / names.LATEST).write_text(STEP, encoding="utf-8")
    uid, gid = second_user()
    chown_tree(root.parent, uid, gid)
    root.parent.chmod(0o777)
    root.chmod(0o777)
    if state_uid is not None:
        os.chown(ckpt / names.TRAINER_STATE, state_uid, gid)
    return root


def _check(config: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", "--check", str(config)])
    return result.exit_code, " ".join(result.output.split())


def test_a_teammates_copy_claiming_your_run_is_refused_by_run_check(tmp_path, corpus, team):
    first_run = tmp_path / "w" / "run2"  # the victim's own run directory, which his copy names
    first_run.mkdir(parents=True)
    config = _stage(tmp_path, corpus, team / "proj" / "vr")
    root = _checkpoint_root(team / "proj" / "vr", config, corpus[0], first_run, TEAMMATE_UID)
    code, said = _check(config)
    assert code == 2, said
    assert f"{root / STEP / names.TRAINER_STATE} belongs to uid {TEAMMATE_UID}," in said, said
    assert f"names your run directory {first_run}: {CLAIM}" in said, said
    with pytest.raises(InitSourceError, match=CLAIM):  # staging and the trainer resolve it so too
        resolve(str(root))


def test_your_runs_checkpoint_on_a_squashing_share_is_loaded_and_said_as_of_no_known_writer(tmp_path, corpus, team):
    first_run = tmp_path / "w" / "run2"  # her run synced it to an all_squash share: every file there is nobody's
    first_run.mkdir(parents=True)
    config = _stage(tmp_path, corpus, team / "proj" / "vr")
    root = _checkpoint_root(team / "proj" / "vr", config, corpus[0], first_run)
    code, said = _check(config)
    assert code == 0, said
    assert f"its checkpoint {root / STEP} belongs to user nobody (uid 65534), {SQUASHED}" in said, said
    assert CLAIM not in said, said
    assert resolve(str(root)).path == root / STEP


def test_a_teammates_own_checkpoint_is_loaded_and_said_with_whose_it_is(tmp_path, corpus, team):
    his_run = team / "his-run"
    his_run.mkdir()
    os.chown(his_run, *second_user())
    config = _stage(tmp_path, corpus, team / "proj" / "vr")
    root = _checkpoint_root(team / "proj" / "vr", config, corpus[0], his_run)
    code, said = _check(config)
    assert code == 0, said
    assert f"init.from = '{root}': its checkpoint {root / STEP} belongs to user nobody" in said, said
    assert f"the directory {team} above it can be written by other users (mode 770, not sticky)" in said, said
    assert "another user's checkpoint is allowed" in said, said
    assert resolve(str(root)).path == root / STEP


def test_a_corpus_in_a_team_directory_others_can_write_is_said(corpus, team):
    mine = team / "corpus"
    shutil.copytree(corpus[0], mine)
    note = owner_note(str(mine))
    assert note.startswith(f"data.prepared {mine} is yours, the directory {team} above it can be written by other "
                           f"users (mode 770, not sticky)"), note
    os.chmod(team, 0o750)  # his group may read it only now: nothing to say
    assert owner_note(str(mine)) == ""


@pytest.fixture
def real_checkpoint(tmp_path, team):
    """(a real tiny checkpoint root in the second user's 0777 directories under the team directory, the victim's
    run directory): its trainer_state.json's run.dir is what each test makes it."""
    from weights_helpers import export_checkpoint

    (tmp_path / "made").mkdir()
    made = export_checkpoint(tmp_path / "made", seed=0)
    root = team / "proj" / "vr"
    shutil.copytree(made.parent, root)
    first_run = tmp_path / "w" / "run2"
    first_run.mkdir(parents=True)
    return root, first_run


def _name_run_dir(ckpt: Path, run_dir: Path, state_uid: int | None = None) -> None:
    """The checkpoint's trainer_state.json naming `run_dir`, its manifest rehashed (as the audit's attacker did),
    then all of it the second user's; its trainer_state.json then `state_uid`'s where one is given."""
    import hashlib

    state = json.loads((ckpt / names.TRAINER_STATE).read_text())
    state["config"]["run"] = {"dir": str(run_dir)}
    data = json.dumps(state).encode()
    (ckpt / names.TRAINER_STATE).write_bytes(data)
    manifest = json.loads((ckpt / names.MANIFEST).read_text())
    manifest["files"][names.TRAINER_STATE] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / names.MANIFEST).write_text(json.dumps(manifest))
    uid, gid = second_user()
    root = ckpt.parent
    chown_tree(root.parent, uid, gid)
    root.parent.chmod(0o777)
    root.chmod(0o777)
    if state_uid is not None:
        os.chown(ckpt / names.TRAINER_STATE, state_uid, gid)


@pytest.mark.parametrize("whose", ["a copy naming your run", "his own", "yours on a squashing share"])
def test_export_says_a_teammates_checkpoint_and_refuses_his_copy_claiming_your_run(real_checkpoint, tmp_path, whose):
    root, first_run = real_checkpoint
    ckpt = next(root.glob("step-*"))
    his_run = root.parent.parent / "his-run"
    his_run.mkdir()
    os.chown(his_run, *second_user())
    _name_run_dir(ckpt, his_run if whose == "his own" else first_run,
                  TEAMMATE_UID if whose == "a copy naming your run" else None)
    out = tmp_path / "e.pth"
    result = CliRunner().invoke(app, ["export", str(root), "--format", "minimind", "--out", str(out)])
    said = " ".join(result.output.split())
    if whose == "his own":
        assert result.exit_code == 0 and out.is_file(), said
        assert f"minilmd export: note: its checkpoint {ckpt} belongs to user nobody" in said, said
    elif whose == "yours on a squashing share":
        assert result.exit_code == 0 and out.is_file(), said
        assert f"its checkpoint {ckpt} belongs to user nobody (uid 65534), {SQUASHED}" in said, said
    else:
        assert result.exit_code == 1 and not out.exists(), said
        assert f"{ckpt / names.TRAINER_STATE} belongs to uid {TEAMMATE_UID}," in said and CLAIM in said, said
        sampled = CliRunner().invoke(app, ["sample", str(root), "--prompt", "hi", "--max-new-tokens", "2"])
        assert sampled.exit_code == 1 and CLAIM in " ".join(sampled.output.split()), sampled.output
