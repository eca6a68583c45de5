"""What a run needs in memory before its first step, against what its device offers: the one rule that refuses a
`train.micro_batch_size` (or a validation set) that cannot fit, at `run --check`, at the launch before staging
(daemon/preflight.py) and in the trainer at its start (trainer/loop/entry.py run), exit 2 each: a config error, never
restarted. Before, a micro-batch of 1e8 rows passed `--check`, and the trainer ran for minutes without a step or
died in a NumPy allocation traceback.

The estimate is first order, and says what it counts (Need.parts):
  - the model's state: fp32 weights, their gradients and AdamW's two moments, 16 bytes a parameter (a LoRA run: its
    frozen base's weights, 4 bytes a parameter; its adapters are small);
  - the micro-batch's tensors: ids, labels and a mask or positions, int64, 3 x 8 bytes a token (a DPO micro-batch
    of n pairs is 2n rows);
  - the activations autograd keeps for the backward, per layer and token: about 12 x hidden_size + 4 x the SwiGLU
    width values (norms, q/k/v and their norms and rotations, the attention output, o_proj, the residuals, gate,
    up, their product, down) in the compute dtype (bf16 where the run autocasts, else fp32); with data.doc_mask on
    the CPU also the attention scores and probabilities (its dense mask runs torch's math kernel: heads x seq_len^2
    per row and layer; the causal kernels keep none);
  - the logits: fp32 and their gradient, about 12 bytes a logit, for two loss chunks of CHUNK_TOKENS tokens at most
    (trainer/model/loss.py: the others are recomputed; DPO's per-row sums use the same chunks);
  - on the CPU, the validation rows, built whole before the first step: data.val_windows at most what the val split
    holds, and as many of [eval] probe's, as int64 tensors as the micro-batch's.
It leaves out the allocator's fragmentation, torch.compile's workspace and the CUDA context: close to the limit it
is no proof either way, so the rule is lenient. Only an estimate over OVER_FACTOR times what the device offers is
refused (a clear impossibility); one over NEAR_SHARE of it is a note (on a card the supervisor's CUDA OOM retry,
which halves the micro-batch and keeps the global batch, handles the rest; on the CPU nothing halves it, so the note
gives the way out; at a micro-batch of 1 nothing halves it on either, and the note says so). What the device
offers: the card's total memory where the run trains on CUDA (the supervisor waits for a free card), the host's
total memory on the CPU (host_offer): what cannot change between two starts of the run, so that a refusal is as
final as its exit 2. What the host has
available now (host_available: another user may hold most of it for a while) is a note only (available_note),
at every start: a restart while the memory is briefly taken must not end a run that finishes unattended.
Torch-free, numpy-free.
"""
from __future__ import annotations

from dataclasses import dataclass

from minilmd.config import RunConfig
from minilmd.corpus_meta import data_format_of, meta_value
from minilmd.model_shapes import expected_state_shapes, parameter_count

OVER_FACTOR = 2.0
"""An estimate over this many times the device's memory is refused; below it the supervisor's OOM retry decides."""
NEAR_SHARE = 0.8
"""An estimate over this share of the device's memory (and not refused) is a note: it may not fit."""
CHUNK_TOKENS = 8192
"""About this many tokens' logits per loss chunk: 8192 x 6400 x 4 B = 210 MB of fp32 (nanochat/Liger use 4-8k).
Here, not in trainer/model/loss.py, so that the estimate counts the chunks the loss makes."""
GIB = 1024 ** 3
TOKEN_BYTES = 3 * 8
"""A row's token costs int64 ids, labels, and a loss mask or positions."""


def chunk_rows_for(seq_len: int, chunk_tokens: int = CHUNK_TOKENS) -> int:
    """Sequences per loss chunk for rows of `seq_len` tokens: at least one."""
    return max(1, chunk_tokens // max(seq_len, 1))


@dataclass(frozen=True)
class Offer:
    """What the device offers the run: bytes, and in words ("GPU memory of an NVIDIA H100 (79.1 GiB)")."""

    bytes: int
    what: str


@dataclass
class Need:
    """The estimate, part by part (bytes, what), and what it was made for (so that the way out can make it again
    for a smaller micro-batch)."""

    parts: list[tuple[int, str]]
    data_format: str
    on_gpu: bool
    val_rows: int = 0

    @property
    def total(self) -> int:
        return sum(n for n, _ in self.parts)

    @property
    def item(self) -> str:
        """What a micro-batch counts: pairs in DPO, else rows."""
        return "pairs" if self.data_format == "dpo" else "rows"

    def describe(self) -> str:
        return " + ".join(f"{_gib(n)} {what}" for n, what in self.parts if n)


def fit(cfg: RunConfig, meta: dict | None, offer: Offer, on_gpu: bool, probe_meta: dict | None = None,
        host: Offer | None = None, available: Offer | None = None) -> tuple[list[str], str | None]:
    """(The refusals, a note) of the run against what its device `offers`: the validation rows (the corpus's val
    split and [eval] probe's, from their meta.json `meta` and `probe_meta`; None: none counted), built whole in host
    memory before the first step, against `host` (the host's total memory; None: not judged), then the
    micro-batch's estimate (judge). A validation set that alone cannot fit is the one refusal: no micro-batch would.
    `available` (the host's memory available now) is judged for a note only (available_note)."""
    data_format = data_format_of(meta) if meta is not None else "text"
    rows = val_rows(cfg, meta) + val_rows(cfg, probe_meta, probe=True)
    held = rows * cfg.train.seq_len * TOKEN_BYTES
    if host is not None and held > OVER_FACTOR * host.bytes:
        whose = "the val split's and [eval] probe's" if probe_meta else "the val split's"
        return [(f"data.val_windows = {cfg.data.val_windows:,} builds {rows:,} validation rows ({whose}) of "
                 f"{cfg.train.seq_len} tokens before the first step: about {_gib(held)}, over {OVER_FACTOR:g} x the "
                 f"{_gib(host.bytes)} of {host.what}: it cannot fit. Lower data.val_windows")], None
    need = micro_batch_need(cfg, data_format, on_gpu, rows)
    refused, near = judge(cfg, need, offer)
    if refused:
        return [refused], None
    short = available_note(need.total if not on_gpu else held, available)
    return [], "; ".join(note for note in (near, short) if note) or None


def available_note(in_host: int, available: Offer | None) -> str | None:
    """The note for `in_host` bytes the run holds in host memory before its first step (on the CPU its whole
    estimate; on a GPU its validation rows) over what the host has `available` now: others' use may leave it
    short until they free it; never a refusal (the host's total decides that: the module docstring)."""
    if available is None or in_host <= available.bytes:
        return None
    return (f"the run holds about {_gib(in_host)} in host memory before its first step, more than the "
            f"{_gib(available.bytes)} of {available.what}: other processes hold the rest, so it may run out of "
            f"memory until they free it (the supervisor restarts it after an OOM)")


def val_rows(cfg: RunConfig, meta: dict | None, probe: bool = False) -> int:
    """The validation set's rows (plan/samplers.py validation_batches; DPO's pairs, plan/pairs.py; `probe`: [eval]
    probe's, plan/early_stop.py probe_batches): data.val_windows at most, and no more than the val split holds (its
    seq_len windows, its documents, or its pairs x 2); 0 for a meta.json that does not say."""
    tokens, documents = meta_value(meta, "splits", "val", "tokens"), meta_value(meta, "splits", "val", "documents")
    if not isinstance(tokens, int) or not isinstance(documents, int):
        return 0
    data_format, want = data_format_of(meta or {}), cfg.data.val_windows
    if data_format == "dpo" and not probe:
        return 2 * min(want, documents // 2)
    mode = cfg.data.mode if cfg.is_set("data.mode") or data_format == "text" else "bucketed"  # SFT's default
    windows = data_format == "text" if probe else mode == "packed" and not (data_format == "chat" and cfg.data.doc_mask)
    return min(want, max(1, tokens // max(cfg.train.seq_len, 1)) if windows else documents)


def micro_batch_need(cfg: RunConfig, data_format: str, on_gpu: bool, val_rows: int = 0,
                     micro_batch_size: int | None = None) -> Need:
    """The estimate (module docstring) for `micro_batch_size` (None: train.micro_batch_size) items of `data_format`
    ("dpo": pairs) at train.seq_len, on CUDA (`on_gpu`) or the CPU; `val_rows` the validation set's rows (counted
    on the CPU)."""
    m, t = cfg.model, cfg.train
    per_item = 2 if data_format == "dpo" else 1
    act = 2 if t.dtype == "bf16" or (t.dtype == "auto" and on_gpu) else 4
    seq = t.seq_len
    params = parameter_count(expected_state_shapes(m))
    state = params * (4 if cfg.lora.enabled else 16)
    token_bytes = TOKEN_BYTES
    per_token = m.num_hidden_layers * (12 * m.hidden_size + 4 * m.ffn_size) * act + 2 * m.hidden_size * act
    dense_mask = cfg.data.doc_mask and not on_gpu  # the CPU's document mask: a dense one, torch's math kernel
    scores = m.num_hidden_layers * m.num_attention_heads * seq * seq * 2 * act if dense_mask else 0
    per_row = seq * (token_bytes + per_token) + scores
    rows = (micro_batch_size or t.micro_batch_size) * per_item
    chunked = min(rows, 2 * chunk_rows_for(seq)) * seq * m.vocab_size * 12  # two chunks at most, DPO's too
    parts = [(state, "for the model's weights" + ("" if cfg.lora.enabled else ", gradients and AdamW state")),
             (rows * seq * token_bytes, f"for a micro-batch's tensors ({rows:,} rows x {seq} tokens)"),
             (rows * (per_row - seq * token_bytes), "for its activations"),
             (chunked, "for the loss chunks' logits")]
    if not on_gpu and val_rows:
        parts.append((val_rows * seq * token_bytes, f"for the validation rows ({val_rows:,})"))
    return Need(parts, data_format, on_gpu, val_rows)


def judge(cfg: RunConfig, need: Need, offer: Offer) -> tuple[str | None, str | None]:
    """(the refusal, the note): the refusal when the estimate is over OVER_FACTOR times what the device offers, the
    note when it is over NEAR_SHARE of it; each with the figures, the refusal with the way out."""
    total, t = need.total, cfg.train
    figures = f"about {_gib(total)} before the first step ({need.describe()})"
    if total > OVER_FACTOR * offer.bytes:
        return (f"train.micro_batch_size = {t.micro_batch_size:,} at train.seq_len = {t.seq_len} needs {figures}, "
                f"over {OVER_FACTOR:g} x the {_gib(offer.bytes)} of {offer.what}: it cannot fit. "
                f"{way_out(cfg, need, offer)}"), None
    if total > NEAR_SHARE * offer.bytes:
        near = "more than" if total > offer.bytes else "close to"
        if t.micro_batch_size == 1:  # the OOM retry has nothing to halve, and way_out no smaller micro-batch
            then = ("nothing halves a micro-batch of 1 (" + ("a CUDA OOM restarts it as it was" if need.on_gpu else
                    "the kernel's OOM killer ends the run and its restarts run out of memory the same way") +
                    "): a smaller model, a shorter train.seq_len, or a device with more memory")
        elif need.on_gpu:
            then = "the supervisor's retry after a CUDA OOM halves the micro-batch and keeps the global batch"
        else:  # the kernel's OOM killer ends a CPU run, which restarts as it was: nothing halves its micro-batch
            then = ("the kernel's OOM killer ends the run and its restarts run out of memory the same way (only a "
                    "CUDA OOM halves the micro-batch). " + way_out(cfg, need, offer))
        return None, (f"train.micro_batch_size = {t.micro_batch_size:,} needs {figures}, {near} the "
                      f"{_gib(offer.bytes)} of {offer.what} (a first-order estimate): if it does not fit, {then}")
    return None, None


def way_out(cfg: RunConfig, need: Need, offer: Offer) -> str:
    """The largest micro-batch whose estimate fits in what the device offers and that divides one rank's share of
    the global batch (so that grad_accum keeps it), in config words; or that nothing of this model and seq_len
    fits."""
    t = cfg.train
    items = t.micro_batch_size * t.grad_accum  # one rank's share of the global batch

    def fits(micro: int) -> bool:
        return micro_batch_need(cfg, need.data_format, need.on_gpu, need.val_rows, micro).total <= offer.bytes

    best = next((d for d in sorted(_divisors(items), reverse=True) if d < t.micro_batch_size and fits(d)), 0)
    if best == 0:
        return ("Not even a micro-batch of 1 fits: a smaller model, a shorter train.seq_len, or a device with more "
                "memory")
    return (f"Set train.micro_batch_size = {best:,} and train.grad_accum = {items // best:,}: the same global batch "
            f"({items:,} {need.item} a rank per step), in micro-batches that fit")


def host_offer() -> Offer | None:
    """The host's total memory (psutil), what a CPU run can never exceed, whoever else runs; None when it cannot
    be read."""
    memory = _virtual_memory()
    return None if memory is None else Offer(int(memory.total), "the host's memory (the CPU is the device)")


def host_available() -> Offer | None:
    """The host's memory available now (psutil: MemAvailable on Linux), for a note only; None when unread."""
    memory = _virtual_memory()
    return None if memory is None else Offer(int(memory.available), "host memory available now")


def _virtual_memory():
    try:
        import psutil

        return psutil.virtual_memory()
    except (ImportError, OSError):
        return None


def _divisors(n: int) -> list[int]:
    """Every divisor of n >= 1, in O(sqrt(n)) (a micro-batch of 1e8 has its way out at once)."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return small + [n // d for d in small]


def _gib(n: int | float) -> str:
    if n >= GIB / 10:
        return f"{n / GIB:,.1f} GiB"
    return f"{n / 1024 ** 2:,.1f} MiB" if n >= 1024 ** 2 / 10 else f"{n / 1024:,.1f} KiB"
