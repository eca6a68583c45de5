"""A failed launch (run.dir full at once, say) leaves its freshly claimed scratch holding only owner.json; its
run.dir then gone (moved to a roomier disk), the next launch of the same run.name is refused with words that say so
and how to take it (`rm -r` it, or set run.scratch), never removed by minilmd: it did not make it (new-user audit,
fullrun11). Anything more in it, a run.dir still there or a link where checkpoints/ goes: the plain refusal."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from minilmd import run_owner, scratch
from minilmd.names import CHECKPOINTS, SCRATCH_OWNER


def _marked(tmp_path: Path, old_run: Path) -> Path:
    place = tmp_path / "shm" / "same-name"
    place.mkdir(parents=True, mode=0o700)
    (place / SCRATCH_OWNER).write_bytes(run_owner.encode(run_owner.record(old_run, "same-name")))
    return place


@pytest.mark.parametrize("with_empty_checkpoints", [False, True])
def test_a_marker_only_scratch_of_a_gone_run_dir_is_said_so_and_left(tmp_path, with_empty_checkpoints):
    old_run = tmp_path / "gone" / "run"
    place = _marked(tmp_path, old_run)
    if with_empty_checkpoints:
        (place / CHECKPOINTS).mkdir()
    new_run = tmp_path / "roomy" / "run"
    found = scratch.problems(place, new_run, is_default=False)
    assert len(found) == 1 and "belongs to another run" not in found[0], found
    assert f"holds only the marker of the run in {old_run.resolve()}, whose run.dir is gone" in found[0], found
    assert f"`rm -r {place}`" in found[0] and "set run.scratch" in found[0], found
    with pytest.raises(scratch.ScratchRefused, match="holds only the marker"):
        scratch.claim(place, new_run, "same-name", is_default=False)
    assert sorted(os.listdir(place)) == sorted([SCRATCH_OWNER] + ([CHECKPOINTS] if with_empty_checkpoints else []))


def _link_to_empty(place: Path) -> None:
    (place.parent / "empty").mkdir()
    (place / CHECKPOINTS).symlink_to(place.parent / "empty")


@pytest.mark.parametrize("more", ["run_dir_there", "a_checkpoint", "corpus", "checkpoints_link"])
def test_anything_more_is_the_plain_refusal(tmp_path, more):
    old_run = tmp_path / "old" / "run"
    place = _marked(tmp_path, old_run)
    if more == "run_dir_there":
        old_run.mkdir(parents=True)
    elif more == "a_checkpoint":
        (place / CHECKPOINTS / "step-00000010").mkdir(parents=True)
    elif more == "corpus":
        (place / "corpus").mkdir()
    else:
        _link_to_empty(place)
    found = scratch.problems(place, tmp_path / "roomy" / "run", is_default=False)
    assert len(found) == 1 and "belongs to another run" in found[0] and "holds only the marker" not in found[0], found
