"""`minilmd status`'s step line of a DPO run stopped in its reference pass: the pairs its step 0 kept
(daemon/views/savedpass.py), read from that step 0's manifest as a file another user may have planted is read. The
real trainer stopped under a real supervisor: tests/test_dpo_reference_pass.py (status after `minilmd stop`)."""
from __future__ import annotations

import json
import os

import pytest

from minilmd import names
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.views.savedpass import saved_pass_words
from minilmd.daemon.views.status import summary_lines


def _stopped(tmp_path, manifest: dict | str, name: str = "step-00000000") -> StateJson:
    step0 = tmp_path / "scratch" / "checkpoints" / name
    step0.mkdir(parents=True)
    (step0 / names.MANIFEST).write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return StateJson.from_dict({"phase": "done", "progress": {"step": 0, "reference_pass": [408, 2490]},
                                "local_checkpoint": {"step": 0, "time": 1.0, "path": str(step0)}})


def test_a_stopped_pass_shows_its_saved_pairs_on_the_step_line(tmp_path):
    state = _stopped(tmp_path, {"step": 0, names.REFERENCE_PASS: [408, 2490], "files": {}})
    words = saved_pass_words(tmp_path, state)
    assert words == " (DPO reference pass 408/2,490 pairs saved)"
    lines = summary_lines(state, alive=False, saved_pass=words)
    assert "  step 0 (DPO reference pass 408/2,490 pairs saved)" in lines, lines
    live = summary_lines(state, alive=True, saved_pass=words)  # a pass running: its own words say how far it is
    assert not any("saved)" in line for line in live), live


@pytest.mark.parametrize("manifest", [{"step": 0, "files": {}}, {"step": 0, names.REFERENCE_PASS: [3000, 2490]},
                                      {"step": 1, names.REFERENCE_PASS: [1, 2]}, "[" * 100_000, "not json"])
def test_a_complete_pass_or_a_malformed_manifest_says_nothing(tmp_path, manifest):
    assert saved_pass_words(tmp_path, _stopped(tmp_path, manifest)) == ""


def test_a_manifest_behind_a_link_another_users_or_not_a_step_0_is_not_read(tmp_path):
    good = {"step": 0, names.REFERENCE_PASS: [408, 2490]}
    assert saved_pass_words(tmp_path, _stopped(tmp_path / "a", good, name="step-00000005")) == ""
    state = _stopped(tmp_path / "b", good)
    manifest = tmp_path / "b" / "scratch" / "checkpoints" / "step-00000000" / names.MANIFEST
    (tmp_path / "elsewhere.json").write_text(json.dumps(good))
    manifest.unlink()
    manifest.symlink_to(tmp_path / "elsewhere.json")
    assert saved_pass_words(tmp_path, state) == ""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    manifest.unlink()
    manifest.write_text(json.dumps(good))
    os.chown(manifest, 65534, 65534)  # nobody's file where the run's checkpoint is: not the trainer's
    assert saved_pass_words(tmp_path, state) == ""
