"""A trainer's final refusal reaches `status` whole (user6 #1). The supervisor kept only the attempt log's last 3
lines, so a refusal that ends in the [model] lines to paste was recorded as `config error, final:
num_attention_heads = 4 | num_hidden_layers = 2 | ...`, without the sentence saying why; the explanation was only in
logs/attempt-0001.log. Now the trainer leaves its refusal in fault.json (kind "refused", trainer/loop/exits.py) and
the supervisor records it whole (bounded); `status` shows its first line and the lines to paste, each on its own
line and escaped, and the supervisor's log has it all."""
from __future__ import annotations

import sys
import time

import pytest
import torch

from minilmd import protocol
from minilmd.config import load_config
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.child.death import REFUSAL_MAX, classify
from minilmd.daemon.child.process import launch
from minilmd.daemon.views.status import BLOCK_LINES, summary_lines
from minilmd.model_shapes import EMBED_KEY, TIED_HEAD_KEY, expected_state_shapes
from supervisor_helpers import cli, start_supervisor, state, wait_or_kill, write_config

REFUSAL = ("init.from = '/p/sft.pth': its tensors' shapes are of another model config: model.num_attention_heads: "
           "source 4, run 2 (default), ...; [model] is not inherited from init.from: set the source's values in this "
           "config's [model]:\n      [model]\n      num_attention_heads = 4\n      num_key_value_heads = 2")


def _refusing_child(tmp_path, fault: str | None, status: int = protocol.EXIT_CONFIG):
    """A real child that refuses as the trainer does: its refusal on stderr, ending in the lines to paste, and
    (`fault`) fault.json's "refused" record; its classified death."""
    code = (f"import os, sys; from minilmd import protocol\n"
            f"print('minilmd train: sft.toml: 1 problem(s):\\n  - ' + {REFUSAL!r}, file=sys.stderr)\n"
            + (f"protocol.write_fault(os.environ['MINILMD_RUN_DIR'], 'refused', {fault!r}, exit={status})\n"
               if fault is not None else "")
            + f"sys.exit({status})")
    child = launch([sys.executable, "-c", code], tmp_path, 1, devices="")
    return classify(child, child.popen.wait(60), tmp_path, stop_requested=False)


def test_a_refusal_in_fault_json_is_the_death_detail_whole(tmp_path):
    death = _refusing_child(tmp_path, REFUSAL)
    assert (death.cause, death.detail) == ("config_error", REFUSAL), death
    # without fault.json (a trainer that refused before it could write one): the log's last lines, as before
    death = _refusing_child(tmp_path, None)
    assert death.detail.startswith("[model] | num_attention_heads = 4"), death.detail
    death = _refusing_child(tmp_path, "x " * REFUSAL_MAX, protocol.EXIT_DATA)  # bounded
    assert death.cause == "data_error" and len(death.detail) < REFUSAL_MAX + 100, len(death.detail)


def test_status_shows_the_refusals_sentence_and_the_lines_to_paste_each_on_a_line():
    message = f"config error, final: {REFUSAL}"
    shown = summary_lines(StateJson.from_dict({"phase": "failed", "reason": message, "last_error": message,
                                               "last_error_at": time.time()}), alive=False)
    why = shown.index(f"  why: config error, final: {REFUSAL.splitlines()[0]}")
    assert shown[why + 1:why + 4] == ["      [model]", "      num_attention_heads = 4", "      num_key_value_heads = 2"]
    last = [line for line in shown if line.startswith("  last error")]
    assert len(last) == 1 and last[0].endswith(": said above"), shown  # the why's words, said once
    long = "\n".join(f"line {n}" for n in range(3 * BLOCK_LINES))
    shown = summary_lines(StateJson.from_dict({"phase": "failed", "reason": long}), alive=False)
    assert f"    ... {2 * BLOCK_LINES} more line(s): `minilmd logs` has them all" in shown, shown


@pytest.mark.slow  # a real supervisor and the real trainer (torch's import): ~30 s
def test_a_supervised_trainers_refusal_of_another_models_pth_is_in_status_whole(tmp_path, corpus):
    """The user's case: a .pth of the same size whose heads differ, in torch's legacy format (one `run --check` and
    the launch do not read: a note), so the trainer is the one that refuses it."""
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(tmp_path / "sft.pth")})
    cfg = load_config(config)
    source = {**cfg.model_dict(), "num_attention_heads": 4, "num_key_value_heads": 2}
    weights = {k: torch.randn(shape) for k, shape in expected_state_shapes(source).items()}
    weights[TIED_HEAD_KEY] = weights[EMBED_KEY]
    torch.save({k: v.half() for k, v in weights.items()}, tmp_path / "sft.pth", _use_new_zipfile_serialization=False)

    rc = wait_or_kill(start_supervisor(config, tmp_path / "supervisor.out", fake=False), 300)
    assert rc == protocol.SUPERVISOR_CONFIG, (tmp_path / "supervisor.out").read_text()[-3000:]
    assert "its tensors' shapes are of another model config" in state(cfg.run_dir)["last_error"]
    shown = cli("status", str(cfg.run_dir)).stdout.splitlines()
    why = next(n for n, line in enumerate(shown) if line.startswith("  why: "))
    assert shown[why].startswith(f"  why: config error, final: init.from = {str(tmp_path / 'sft.pth')!r}: its "
                                 f"tensors' shapes are of another model config: model.num_attention_heads: source 4, "
                                 f"run 2"), shown
    assert shown[why + 1:why + 4] == ["      [model]", "      num_attention_heads = 4", "      num_key_value_heads = 2"]
    logs = cli("logs", str(cfg.run_dir)).stdout
    assert "[model] is not inherited from init.from" in logs and "      num_key_value_heads = 2" in logs, logs
