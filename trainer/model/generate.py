"""Text generation with a KV cache: `generate()` for code, `sample_text()` for `minilmd sample`.

The prompt of a pretrained model is BOS + text, as MiniMind does (its pretraining rows all start with BOS).
Sampling: temperature, then top-k, then top-p (nucleus) on the remaining mass; temperature 0 means greedy.
Generation stops at EOS (per row; finished rows are padded with EOS) or after max_new_tokens.
"""
from __future__ import annotations

from pathlib import Path

import torch

from minilmd.protocol import BOS_ID, EOS_ID
from minilmd.trainer.model.minimind import KVCache, MiniMindForCausalLM


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set to -inf every logit outside the top_k (0: all) and outside the smallest set holding top_p of the
    probability (1.0: all). The most likely token always survives."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(dim=-1)
        # A token is dropped when the mass strictly before it already reaches top_p.
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """(batch, vocab) logits of the last position -> (batch, 1) token ids."""
    if temperature <= 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = filter_logits(logits.float() / temperature, top_k, top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)


@torch.inference_mode()
def generate(model: MiniMindForCausalLM, ids: torch.Tensor | list[int], max_new_tokens: int,
             temperature: float = 0.85, top_p: float = 0.85, top_k: int = 50, *, eos_id: int | None = EOS_ID,
             use_cache: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
    """Continue `ids` ((batch, time) or a flat list) by up to max_new_tokens; returns prompt + continuation.

    use_cache=False recomputes the whole sequence at every step: slow, kept as the reference the cache is
    tested against."""
    device = model.model.embed_tokens.weight.device
    ids = torch.as_tensor(ids, dtype=torch.long, device=device)
    if ids.dim() == 1:
        ids = ids[None]
    batch, prompt_len = ids.shape
    limit = model.config.max_position_embeddings
    if prompt_len + max_new_tokens > limit:
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                         f"max_position_embeddings ({limit})")
    cache = KVCache(model, batch, prompt_len + max_new_tokens) if use_cache else None
    finished = torch.zeros(batch, 1, dtype=torch.bool, device=device)
    out, step_input = ids, ids
    for _ in range(max_new_tokens):
        logits = model(step_input if use_cache else out, cache=cache).logits[:, -1]
        token = next_token(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            token = token.masked_fill(finished, eos_id)
            finished = finished | (token == eos_id)
        out = torch.cat([out, token], dim=1)
        step_input = token
        if eos_id is not None and bool(finished.all()):
            break
    return out


def sample_text(checkpoint: str | Path, prompt: str, tokenizer: str | Path | None = None,
                max_new_tokens: int = 128, temperature: float = 0.85, top_p: float = 0.85, top_k: int = 50,
                seed: int | None = None, device: str = "auto", lora: str | None = None,
                no_lora: bool = False) -> tuple[str, bool]:
    """The continuation of BOS + prompt by the model of a checkpoint, decoded (prompt not repeated), and whether
    that model was trained on conversations (Validated.trained_on_conversations: then `sample --chat` is said)."""
    from tokenizers import Tokenizer

    from minilmd.trainer.model.export import load_model
    from minilmd.trainer.model.tokenizer_files import find_tokenizer

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model, loaded = load_model(checkpoint, device, lora, no_lora)
    checked = None if lora else loaded  # with --lora, the adapter's, not CHECKPOINT's (tokenizer_files._state)
    tok = Tokenizer.from_buffer(find_tokenizer(checkpoint, tokenizer, checked=checked).data)
    prompt_ids = [BOS_ID] + tok.encode(prompt, add_special_tokens=False).ids
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    max_new_tokens = min(max_new_tokens, model.config.max_position_embeddings - len(prompt_ids))
    out = generate(model, prompt_ids, max_new_tokens, temperature, top_p, top_k, generator=generator)
    new = out[0, len(prompt_ids):].tolist()
    if EOS_ID in new:
        new = new[:new.index(EOS_ID)]
    return tok.decode(new, skip_special_tokens=True), loaded.trained_on_conversations
