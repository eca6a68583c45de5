"""The MiniMind-3 dense language model, laid out exactly like HF Qwen3 so that its weights load in both unchanged.

Read top to bottom: RMSNorm -> rotary embeddings -> attention (GQA, per-head q/k norm) -> SwiGLU MLP -> block ->
the causal LM with its tied head and its shifted loss.

Choices that matter elsewhere:
- Names of parameters are MiniMind's and HF Qwen3's (`model.layers.{i}.self_attn.q_proj.weight`, ...).
- The head is tied to the embeddings. `state_dict()` leaves `lm_head.weight` out and `load_state_dict()` puts it
  back (see minilmd/model_shapes.py for why); so `model.state_dict()` is exactly what a checkpoint stores.
- Init (`init_weights`): normal(0, 0.02) for every Linear and the Embedding, ones for every RMSNorm weight, drawn
  from the current torch RNG in module order, so the same seed gives the same model on every machine.
- The forward pass does no per-token Python work: one SDPA call per layer (causal, flash on CUDA), RMSNorm in
  fp32 (so bf16 autocast keeps the norm statistics exact), RoPE from a precomputed fp32 table.
- `forward(ids, labels)` shifts inside: the logits at position i are scored against labels[:, i + 1] (ignore_index
  -100). The labels are shifted, not the logits: `logits[:, :-1]` would be a strided view that the loss copies
  (twice with the fp32 cast under bf16); `next_token_loss` scores the whole contiguous logits in one fp32 pass, the
  last position ignored. The trainer builds its shifted labels on the device (`next_token_labels`).
- `forward(ids, hidden_states=True)` is the trainer's: the final hidden states, no logits; its objective
  (trainer/loop/objective.py) runs the head and the loss on them in chunks of rows, so that no logits of the whole
  batch exist (trainer/model/loss.py). The model computes no training loss of its own.
- `forward(ids, ..., positions=...)` is packed training with `data.doc_mask` (minilmd/plan/docmask.py): each
  token's rotary position within its document piece, from which trainer/model/docattention.py derives
  block-causal attention on the device, so that every piece of a row computes what it would alone. Without
  positions (the default, and every export and generation) the forward is the plain causal one, unchanged.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from minilmd.config import ModelSection
from minilmd.model_shapes import EMBED_KEY, TIED_HEAD_KEY, as_model_section
from minilmd.trainer.model.docattention import DocumentMask, attend, masks_for
from minilmd.trainer.model.loss import IGNORE_INDEX, next_token_loss


def next_token_labels(ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, time) int64: at position i the id at i + 1 when that token is a target (targets: 1; None: all are),
    else IGNORE_INDEX; the last position has no next token."""
    labels = torch.full(ids.shape, IGNORE_INDEX, dtype=torch.long, device=ids.device)
    labels[:, :-1] = ids[:, 1:]
    if targets is not None:
        labels[:, :-1].masked_fill_(targets[:, 1:] == 0, IGNORE_INDEX)
    return labels


class CausalLMOutput(NamedTuple):
    logits: torch.Tensor | None
    """(batch, time, vocab), in the compute dtype (bf16 under autocast); None with hidden_states (never built)."""
    loss: torch.Tensor | None
    """With labels: the mean cross-entropy over the labelled positions after the shift; else None."""
    hidden: torch.Tensor | None = None
    """With hidden_states: (batch, time, hidden), after the final norm, what the head would score; else None."""


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in fp32 even under bf16 autocast: the mean of squares of 768 bf16 values loses digits.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x32).to(x.dtype)


def rope_table(head_dim: int, length: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each (length, head_dim), fp32, in HF's half-split layout (frequencies repeated twice)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(length, device=device).float(), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, time, head_dim); cos/sin: (time, head_dim), or (batch, 1, time, head_dim) per row."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


class LayerCache:
    """Keys and values of one layer for generation, preallocated: (batch, kv_heads, max_len, head_dim)."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, device, dtype):
        self.k = torch.zeros(batch, kv_heads, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)

    def update(self, pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = pos + k.shape[2]
        self.k[:, :, pos:end] = k
        self.v[:, :, pos:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


class KVCache:
    """One LayerCache per block plus the number of positions already filled (`pos`)."""

    def __init__(self, model: MiniMindForCausalLM, batch: int, max_len: int, device=None, dtype=None):
        cfg = model.config
        if max_len > cfg.max_position_embeddings:
            raise ValueError(f"a cache of {max_len} positions exceeds max_position_embeddings "
                             f"{cfg.max_position_embeddings}")
        weight = model.model.embed_tokens.weight
        device = device or weight.device
        dtype = dtype or weight.dtype
        self.layers = [LayerCache(batch, cfg.num_key_value_heads, max_len, cfg.head_dim, device, dtype)
                       for _ in range(cfg.num_hidden_layers)]
        self.max_len = max_len
        self.pos = 0


class Attention(nn.Module):
    def __init__(self, cfg: ModelSection):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: LayerCache | None = None, pos: int = 0, doc_mask: DocumentMask | None = None) -> torch.Tensor:
        """doc_mask: the rows' block-causal mask (docattention.masks_for; training only, never with a cache);
        None: causal."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if doc_mask is not None:  # data.doc_mask: attention within each document piece
            y = attend(q, k, v, doc_mask, gqa=self.n_kv_heads != self.n_heads)
            return self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))
        mask, causal = None, True
        if cache is not None:
            k, v = cache.update(pos, k, v)
            if pos > 0:
                # SDPA's is_causal aligns the triangle top-left; with a prefix in the cache, query i (absolute
                # position pos + i) may see keys 0 .. pos + i, so build that mask (one row when decoding).
                causal = False
                keys = torch.arange(pos + t, device=x.device)
                mask = keys[None, :] <= (pos + torch.arange(t, device=x.device))[:, None]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelSection):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block (names as HF Qwen3DecoderLayer)."""

    def __init__(self, cfg: ModelSection):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache: LayerCache | None = None, pos: int = 0, doc_mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, pos, doc_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """The `model.` prefix of every weight name: embeddings, blocks, final norm, and the RoPE table."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelSection):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Not persistent: derived from the config, never saved; filled by init_weights().
        self.register_buffer("rope_cos", torch.empty(cfg.max_position_embeddings, cfg.head_dim), persistent=False)
        self.register_buffer("rope_sin", torch.empty(cfg.max_position_embeddings, cfg.head_dim), persistent=False)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        pos = cache.pos if cache is not None else 0
        t = input_ids.shape[1]
        cos, sin = self.rope_cos[pos:pos + t], self.rope_sin[pos:pos + t]
        doc_mask = None
        if positions is not None:  # data.doc_mask: each piece's own positions, attention within it
            if cache is not None:
                raise ValueError("positions (a document mask) are for training rows, not for a cached generation")
            cos, sin = self.rope_cos[positions][:, None], self.rope_sin[positions][:, None]
            doc_mask = masks_for(positions)
        x = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.layers[i] if cache is not None else None, pos, doc_mask)
        if cache is not None:
            cache.pos = pos + t
        return self.norm(x)


class MiniMindForCausalLM(nn.Module):
    def __init__(self, cfg: ModelSection | dict):
        super().__init__()
        cfg = as_model_section(cfg)
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight
        # The checkpoint format keeps the tied matrix once (model_shapes.py); these hooks make state_dict() and
        # load_state_dict() speak that format, also through DDP/torch.compile wrappers (they pass a prefix).
        self.register_state_dict_post_hook(_drop_tied_head)
        self.register_load_state_dict_pre_hook(_restore_tied_head)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """normal(0, 0.02) on Linear/Embedding weights, ones on norms; recompute the RoPE table (after a
        meta-device construction and `to_empty`, for example)."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                if module is self.lm_head:
                    continue  # the same tensor as the embeddings: draw it once
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        backbone = self.model
        cos, sin = rope_table(self.config.head_dim, self.config.max_position_embeddings, self.config.rope_theta,
                              device=backbone.rope_cos.device)
        backbone.rope_cos.copy_(cos)
        backbone.rope_sin.copy_(sin)

    def num_parameters(self) -> int:
        """Parameters counted once (the tied head is not counted twice)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                cache: KVCache | None = None, positions: torch.Tensor | None = None,
                hidden_states: bool = False) -> CausalLMOutput:
        """input_ids (batch, time) int64 or int32. With labels (same shape; -100 = ignore), the loss compares the logits
        at position i with the label at i + 1. With a cache, input_ids continue the cached sequence.

        The trainer's path: with hidden_states the output holds the final hidden states and neither logits nor loss;
        the training objective scores them (trainer/loop/objective.py).

        positions (batch, time) int, with data.doc_mask: each token's position within its document piece (0 at a
        piece's start); attention stays within each piece (document_mask). None: one sequence per row."""
        hidden = self.model(input_ids, cache) if positions is None else self.model(input_ids, positions=positions)
        if hidden_states:
            return CausalLMOutput(None, None, hidden)
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = next_token_loss(logits, F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX))
        return CausalLMOutput(logits, loss)


def _drop_tied_head(module, state_dict, prefix, local_metadata):
    state_dict.pop(prefix + TIED_HEAD_KEY, None)


def _restore_tied_head(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                       error_msgs):
    # The head is the embedding matrix itself; an export that does carry lm_head.weight loads too.
    if prefix + TIED_HEAD_KEY not in state_dict and prefix + EMBED_KEY in state_dict:
        state_dict[prefix + TIED_HEAD_KEY] = state_dict[prefix + EMBED_KEY]
