"""The model: MiniMind-3 shapes and parameter count, the tied head in state_dict, the direction of the shift,
deterministic init, and a tiny model that learns."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from minilmd.config import ModelSection
from minilmd.model_shapes import expected_state_shapes
from minilmd.trainer.model.minimind import MiniMindForCausalLM
from weights_helpers import tiny_config, tiny_model

torch.set_num_threads(1)


def meta_model(cfg: ModelSection) -> MiniMindForCausalLM:
    with torch.device("meta"):
        return MiniMindForCausalLM(cfg)


def test_minimind3_768x8_has_63_912_192_parameters_on_meta_device():
    model = meta_model(ModelSection())
    assert model.model.embed_tokens.weight.is_meta
    assert model.num_parameters() == 63_912_192
    assert ModelSection().ffn_size == 2432
    layer = model.model.layers[0]
    assert tuple(layer.self_attn.q_proj.weight.shape) == (768, 768)
    assert tuple(layer.self_attn.k_proj.weight.shape) == (384, 768)  # 4 KV heads x 96
    assert tuple(layer.self_attn.q_norm.weight.shape) == (96,)
    assert tuple(layer.mlp.gate_proj.weight.shape) == (2432, 768)


@pytest.mark.parametrize("cfg", [ModelSection(), ModelSection(num_hidden_layers=16),
                                 ModelSection(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                                              num_key_value_heads=2, intermediate_size=1408)])
def test_expected_state_shapes_equal_the_real_state_dict(cfg):
    state = meta_model(cfg).state_dict()
    shapes = expected_state_shapes(cfg)
    assert {k: tuple(v.shape) for k, v in state.items()} == shapes
    assert list(state) == list(shapes)
    assert "lm_head.weight" not in shapes
    assert expected_state_shapes(cfg.__dict__) == shapes  # the dict form read from trainer_state.json


def test_expected_state_shapes_refuses_unknown_config_keys():
    with pytest.raises(ValueError, match="use_moe"):
        expected_state_shapes({**tiny_config().__dict__, "use_moe": True})


def test_model_shapes_does_not_import_torch():
    code = ("import sys; from minilmd.model_shapes import expected_state_shapes; "
            "expected_state_shapes({'hidden_size': 64}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_head_is_tied_and_state_dict_round_trips_strictly():
    model = tiny_model(seed=1)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    state = model.state_dict()
    assert "lm_head.weight" not in state and all(v.dtype == torch.float32 for v in state.values())
    other = tiny_model(seed=2)
    other.load_state_dict(state, strict=True)
    assert other.lm_head.weight is other.model.embed_tokens.weight
    ids = torch.randint(0, 320, (2, 12))
    assert torch.equal(other(ids).logits, model(ids).logits)
    # An exported state dict carries lm_head.weight too: it loads as well.
    third = tiny_model(seed=3)
    third.load_state_dict({**state, "lm_head.weight": state["model.embed_tokens.weight"]}, strict=True)
    assert torch.equal(third(ids).logits, model(ids).logits)


def test_init_is_deterministic_and_follows_the_documented_distribution():
    a, b, c = tiny_model(seed=7), tiny_model(seed=7), tiny_model(seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.self_attn.q_proj.weight"], sc["model.layers.0.self_attn.q_proj.weight"])
    for name, tensor in sa.items():
        if name.endswith("norm.weight"):
            assert torch.equal(tensor, torch.ones_like(tensor)), name
        else:
            assert abs(tensor.std().item() - 0.02) < 0.004, name
            assert abs(tensor.mean().item()) < 0.004, name


class OracleBackbone(nn.Module):
    """Stands in for the transformer: the hidden state at position t is the embedding of the token at t + look.
    look=0 copies the current token, look=+1 cheats and sees the next one, look=-1 repeats the previous one."""

    def __init__(self, embed: nn.Embedding, look: int):
        super().__init__()
        self.embed_tokens, self.look = embed, look

    def forward(self, input_ids, cache=None):
        return self.embed_tokens(torch.roll(input_ids, shifts=-self.look, dims=1))


@pytest.mark.parametrize("look, low", [(1, True), (0, False), (-1, False)])
def test_the_loss_scores_position_t_against_the_token_at_t_plus_1(look, low):
    # Embeddings 10 * identity: the logits of a hidden state E[x] peak sharply at x. Only a model that predicts
    # the next token gets a low loss; a model copying the current token gets a low loss only if the shift is
    # missing, one repeating the previous token only if the shift is reversed.
    vocab = 16
    model = MiniMindForCausalLM(tiny_config(vocab_size=vocab, hidden_size=vocab, num_attention_heads=2,
                                            num_key_value_heads=1))
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(10 * torch.eye(vocab))
    model.model = OracleBackbone(model.model.embed_tokens, look)
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(vocab, generator=g) for _ in range(3)])  # no token repeats in a row
    loss = model(ids, labels=ids).loss.item()
    if low:
        assert loss < 1e-3
    else:
        assert loss > 5.0


def test_labels_minus_100_are_ignored():
    model = tiny_model()
    ids = torch.randint(3, 320, (2, 10))
    labels = ids.clone()
    labels[:, 6:] = -100
    full = model(ids[:, :6], labels=ids[:, :6]).loss
    masked = model(ids, labels=labels).loss
    torch.testing.assert_close(masked, full)  # causal: positions after 6 cannot change the first 5 predictions


def test_bf16_autocast_forward_keeps_fp32_weights_and_a_fp32_loss():
    model = tiny_model()
    ids = torch.randint(0, 320, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, labels=ids)
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32
    torch.testing.assert_close(out.loss, model(ids, labels=ids).loss, atol=0.05, rtol=0.01)


def test_a_tiny_model_learns_a_repeated_sequence():
    model = tiny_model(seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 320, (4, 32), generator=g)
    losses = []
    for _ in range(30):
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[0] > 5.0  # about ln(320) at init
    assert losses[-1] < losses[0] / 3
