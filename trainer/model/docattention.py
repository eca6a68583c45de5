"""Attention within document pieces (`data.doc_mask`): the mask of a packed row, from its tokens' positions.

A row's positions (minilmd/plan/docmask.py) are 0 where a document piece starts, so the cumulative count of
zeros numbers the pieces, and query i may attend key j when j <= i and both are in the same piece. Two forms:
- `document_mask`: a dense (rows, 1, time, time) boolean mask for SDPA. Eager everywhere, and the tested path
  (CPU): it costs a time x time mask per row and SDPA computes every masked block anyway.
- `block_mask`: flex_attention's BlockMask of the same rule, whose kernel skips the blocks no query of a piece may
  see. Only inside torch.compile on CUDA (`use_flex`): flex_attention is a Triton kernel there, while eager it is
  a slow reference implementation. Built inside the compiled forward from the positions tensor, so a new batch is
  new data for the same graph, not a recompile. Its numbers equal the dense path's (tests/test_docmask.py forces
  it on CPU, eager).
Both are built on the device from the positions alone: no host sync.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

DocumentMask = torch.Tensor | BlockMask
"""What every layer of a masked forward shares: the dense boolean mask, or flex_attention's BlockMask."""


def pieces(positions: torch.Tensor) -> torch.Tensor:
    """(rows, time) int: the number of each token's document piece within its row."""
    return torch.cumsum(positions == 0, dim=1)


def document_mask(positions: torch.Tensor) -> torch.Tensor:
    """(rows, 1, time, time) bool, True where query i may attend key j: j <= i, both in the same piece."""
    piece = pieces(positions)
    t = positions.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=positions.device).tril()
    return ((piece[:, :, None] == piece[:, None, :]) & causal)[:, None]


def block_mask(positions: torch.Tensor) -> BlockMask:
    """The same rule as document_mask, as flex_attention's BlockMask (one per row, shared by the heads)."""
    piece = pieces(positions)

    def same_piece_causal(b, h, q, k):
        return (piece[b, q] == piece[b, k]) & (k <= q)

    rows, t = positions.shape
    return create_block_mask(same_piece_causal, rows, None, t, t, device=positions.device)


def use_flex(positions: torch.Tensor) -> bool:
    """flex_attention where its kernel exists: CUDA, inside torch.compile. Everywhere else the dense mask."""
    return positions.is_cuda and torch.compiler.is_compiling()


def masks_for(positions: torch.Tensor) -> DocumentMask:
    """The mask every layer of the forward shares: a BlockMask (use_flex) or the dense boolean mask."""
    return block_mask(positions) if use_flex(positions) else document_mask(positions)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: DocumentMask,
           gqa: bool) -> torch.Tensor:
    """Attention of (batch, heads, time, head_dim) q against k, v within the pieces `mask` allows."""
    if isinstance(mask, BlockMask):
        out = flex_attention(q, k, v, block_mask=mask, enable_gqa=gqa)
        assert isinstance(out, torch.Tensor)  # a tuple only with return_lse
        return out
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
