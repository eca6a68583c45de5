"""Two files a MiniMind user points init.from at that are no dense state dict (user6 #1): a Mixture-of-Experts model's
.pth (use_moe=True: a layer's MLP is mlp.gate and mlp.experts.N) and MiniMind's `*_resume.pth` (trainer_utils.
lm_checkpoint: {'model': state dict, 'optimizer': ..., 'epoch', 'step', ...}). Before, the first got raw lists of
missing and unexpected keys and the second `not a state dict of tensors`, at the trainer's start only (`run --check`
said OK). Now both are refused by `run --check` and by the trainer in the same words: what the file is and what to
use. Real torch.save'd files of MiniMind's layouts."""
from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from minilmd.cli import app
from minilmd.config import ConfigError, load_config
from minilmd.model_shapes import EMBED_KEY, TIED_HEAD_KEY, expected_state_shapes
from minilmd.protocol import SUPERVISOR_CONFIG
from trainer_corpus import TINY_MODEL, write_config

MOE_WORDS = ("a Mixture-of-Experts MiniMind model (use_moe: mlp.experts.N, mlp.gate): minilmd trains the dense model "
             "only")


def _weights(model: dict, moe: bool = False) -> dict:
    """A state dict as MiniMind's trainers save it (fp16, the tied head among it); `moe`: MOEFeedForward's layers
    (MiniMind's model_minimind.py: a gate over 4 experts, each a FeedForward)."""
    state = {k: torch.randn(shape) for k, shape in expected_state_shapes(model).items()}
    state[TIED_HEAD_KEY] = state[EMBED_KEY]
    if moe:
        for key in [k for k in state if ".mlp." in k]:
            layer, proj = key.split(".mlp.")
            for expert in range(4):
                state[f"{layer}.mlp.experts.{expert}.{proj}"] = state[key].clone()
            state[f"{layer}.mlp.gate.weight"] = torch.randn(4, model["hidden_size"])
            del state[key]
    return {k: v.half() for k, v in state.items()}


def _resume(weights: dict) -> dict:
    """What lm_checkpoint saves as `<weight>_<hidden>_resume.pth`: the weights beside AdamW's state after a step."""
    params = [torch.nn.Parameter(v.float()) for v in weights.values()]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    sum(p.sum() for p in params).backward()
    optimizer.step()
    return {"model": weights, "optimizer": optimizer.state_dict(), "epoch": 0, "step": 40, "world_size": 1,
            "wandb_id": None}


def _stage(tmp_path, corpus, source):
    return write_config(tmp_path, corpus, name="sft", init={"from": str(source)}, model=TINY_MODEL)


def _refused_both_ways(config) -> tuple[str, str]:
    """(run --check's output, the trainer's refusal): both must refuse."""
    checked = CliRunner().invoke(app, ["run", "--check", str(config)])
    assert checked.exit_code == SUPERVISOR_CONFIG, checked.output
    from minilmd.trainer.checkpoint.init_weights import load_init

    with pytest.raises(ConfigError) as refused:
        load_init(load_config(config))
    [trainer_said] = refused.value.problems
    return checked.output, trainer_said


@pytest.mark.slow  # run --check and the trainer's load: ~4 s
def test_a_moe_pth_is_refused_as_one_by_check_and_trainer(tmp_path, corpus):
    model = load_config(write_config(tmp_path, corpus, name="pre", model=TINY_MODEL)).model_dict()
    pth = tmp_path / "pretrain_64_moe.pth"
    torch.save(_weights(model, moe=True), pth)
    checked, trainer_said = _refused_both_ways(_stage(tmp_path, corpus, pth))
    assert f"init.from = {str(pth)!r}: its tensors are of {MOE_WORDS}" in " ".join(checked.split()), checked
    assert trainer_said == f"init.from = {str(pth)!r}: its tensors are of {MOE_WORDS}", trainer_said
    assert "missing [" not in checked and "unexpected [" not in trainer_said


@pytest.mark.slow  # run --check twice and the trainer's load: ~4 s
def test_minimind_resume_file_is_refused_naming_the_weights_file(tmp_path, corpus):
    model = load_config(write_config(tmp_path, corpus, name="pre", model=TINY_MODEL)).model_dict()
    dense = _weights(model)
    pth = tmp_path / "checkpoints" / "full_sft_64_resume.pth"
    pth.parent.mkdir()
    torch.save(_resume(dense), pth)
    checked, trainer_said = _refused_both_ways(_stage(tmp_path, corpus, pth))
    words = ("this is MiniMind's resume file (its 'model' entry holds the weights, beside the optimizer's state): "
             "use the weights file MiniMind saves with it, full_sft_64.pth (in its checkpoints/, and out/)")
    assert f"init.from = {str(pth)!r}: {words}" in " ".join(checked.split()), checked
    assert trainer_said == f"init.from = {str(pth)!r}: {words}", trainer_said
    assert "not checked here" not in checked, checked  # a refusal, not a note

    torch.save(dense, pth.with_name("full_sft_64.pth"))  # the file it names starts the run
    ok = CliRunner().invoke(app, ["run", "--check", str(_stage(tmp_path, corpus, pth.with_name("full_sft_64.pth")))])
    assert ok.exit_code == 0, ok.output


def test_a_resume_file_over_the_bound_still_says_which_file_to_use(tmp_path, corpus):
    """A resume file larger than a .pth of the model may be (the optimizer's moments: a model whose embedding is a
    smaller share than here) is refused by its size before it is read: the size refusal names the weights file."""
    from minilmd.init_pth import _too_big
    from minilmd.init_source import InitSource

    said = str(_too_big(InitSource("minimind", tmp_path / "pretrain_512_resume.pth"), TINY_MODEL, 1 << 20))
    assert "more than a state dict of this run's model can be; this is MiniMind's resume file" in said, said
    assert "pretrain_512.pth" in said, said
