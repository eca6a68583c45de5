"""init.from naming a teammate's checkpoint root or run directory (a real second user, nobody; a third uid without
an account where a file must be someone else's): what the source holds is walked by descriptor
(minilmd/init_place.py), no link followed, no FIFO opened, each file its owner's (or ours) before it is parsed.

Reproduced on the code before: a trainer_state.json, a LATEST, a manifest.json or a step directory of a third uid
planted in the teammate's root was read and trusted (`source_model` read trainer_state.json with no owner, the step
directory LATEST names was looked at by path, links followed); a link or a FIFO at LATEST, trainer_state.json or
run.toml was refused only as "without LATEST", "no readable config.model (...)" or "does not load", or, for a
run.toml link to /dev/zero, not seen at all (the run directory taken for a root without LATEST).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from minilmd import names
from minilmd.init_source import InitSourceError, model_problems, predecessor, resolve
from second_user import chown_tree, second_user, shared_dir, teammate  # noqa: F401 - teammate: a fixture
from waiting import without_blocking

pytestmark = pytest.mark.root

THIRD_UID = 54321
MODEL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 300}
STEP = "step-00000001"


def _teammates_root(teammate) -> Path:
    """A teammate's checkpoint root (LATEST -> step-00000001, its manifest and trainer_state.json), all hers; it
    is a good init.from as it is (checked here, so each test below starts from a source that works)."""
    (uid, gid), where = teammate
    root = where / "hers" / "checkpoints"
    step = root / STEP
    step.mkdir(parents=True)
    (step / names.MANIFEST).write_text(json.dumps({"step": 1, "files": {}}))
    (step / names.TRAINER_STATE).write_text(json.dumps({"config": {"model": MODEL}}))
    (root / names.LATEST).write_text(STEP)
    chown_tree(where / "hers", uid, gid)
    source = resolve(str(root))
    assert (source.kind, source.path, source.pointer) == ("checkpoint", step, names.LATEST)
    assert model_problems(str(root), MODEL) == []
    return root


def _elsewhere(where: Path, text: str) -> Path:
    """A file of a third uid outside the source, saying `text`: what a planted link leads to."""
    target = where / "elsewhere"
    target.write_text(text)
    os.chown(target, THIRD_UID, THIRD_UID)
    return target


@pytest.mark.parametrize("to", ["another user's file", "/dev/zero"])
def test_a_link_at_latest_is_refused_naming_it_not_followed(teammate, to):
    root = _teammates_root(teammate)
    target = _elsewhere(teammate[1], STEP) if to != "/dev/zero" else Path("/dev/zero")
    (root / names.LATEST).unlink()
    (root / names.LATEST).symlink_to(target)
    with pytest.raises(InitSourceError, match=f"{root}: LATEST is a symbolic link: not followed"):
        without_blocking(lambda: resolve(str(root)))


@pytest.mark.parametrize("to", ["another user's file", "/dev/zero"])
def test_a_link_at_trainer_state_json_is_refused_naming_it_not_followed(teammate, to):
    root = _teammates_root(teammate)
    target = _elsewhere(teammate[1], json.dumps({"config": {"model": MODEL}})) if to != "/dev/zero" \
        else Path("/dev/zero")
    (root / STEP / names.TRAINER_STATE).unlink()
    (root / STEP / names.TRAINER_STATE).symlink_to(target)
    with pytest.raises(InitSourceError, match=f"{root / STEP}: trainer_state.json is a symbolic link: not followed"):
        without_blocking(lambda: model_problems(str(root), MODEL))


@pytest.mark.parametrize("name", [names.TRAINER_STATE, names.LATEST])
def test_a_fifo_in_the_source_never_blocks_and_is_named(teammate, name):
    root = _teammates_root(teammate)
    fifo = root / (STEP if name == names.TRAINER_STATE else "") / name
    fifo.unlink()
    os.mkfifo(fifo)
    os.chown(fifo, *teammate[0])
    with pytest.raises(InitSourceError, match=f"{fifo.parent}: {name} is a FIFO: not read"):
        without_blocking(lambda: model_problems(str(root), MODEL), fifo)


@pytest.mark.parametrize("planted", [names.TRAINER_STATE, names.MANIFEST, names.LATEST, "the step directory"])
def test_a_third_users_file_inside_the_teammates_source_is_not_read(teammate, planted):
    root = _teammates_root(teammate)
    path = {names.LATEST: root / names.LATEST, "the step directory": root / STEP}.get(planted, root / STEP / planted)
    os.chown(path, THIRD_UID, THIRD_UID)
    with pytest.raises(InitSourceError, match=f"{path.name} is owned by uid {THIRD_UID}, not by the source's owner"
                                              f", user nobody \\(uid {teammate[0][0]}\\), nor by you: not read"):
        model_problems(str(root), MODEL)


def test_a_step_directory_latest_names_that_is_a_link_is_refused_not_followed(teammate):
    root = _teammates_root(teammate)
    (root / STEP).rename(teammate[1] / "moved")
    (root / STEP).symlink_to(teammate[1] / "moved")  # the same checkpoint, through a link she no longer controls
    with pytest.raises(InitSourceError, match=f"{root}: {STEP} is a symbolic link: not followed"):
        resolve(str(root))


@pytest.mark.parametrize("to", ["another user's file", "/dev/zero"])
def test_a_link_at_a_teammates_run_toml_is_refused_naming_it(teammate, to):
    (uid, gid), where = teammate
    run_dir = where / "her-run"
    run_dir.mkdir()
    target = _elsewhere(where, '[run]\nname = "x"\n') if to != "/dev/zero" else Path("/dev/zero")
    (run_dir / names.RUN_CONFIG_COPY).symlink_to(target)
    chown_tree(run_dir, uid, gid)
    with pytest.raises(InitSourceError, match=f"{run_dir}: run.toml is a symbolic link: not followed"):
        without_blocking(lambda: predecessor(str(run_dir)))
