"""The values of a run config, checked: every number finite and in its range (RANGES, one table), every choice one
of its own (CHOICES, beside it), the names, the
durations, the rules between fields, and the message for a missing budget; every problem as a line, none raised.
minilmd/config.py (the parsing of the schema, minilmd/config_sections.py) calls `check_values` once every key is
read. Torch-free, and it reads
nothing: what the paths hold is minilmd/probes.py's.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass

from minilmd import names, perms
from minilmd.config_sections import (
    DATA_MODES,
    DPO_ONLY_METRICS,
    EARLY_STOP_METRICS,
    LORA_TARGETS,
    ONE_DOCUMENT_A_ROW,
    PATH_KEYS,
    Duration,  # noqa: F401 - found here too, with parse_duration, by the daemon and the tests
    ModelSection,
    RunConfig,
    parse_duration,
)
from minilmd.fmt import fmt_duration
from minilmd.model_shapes import expected_adapter_shapes, expected_state_shapes, parameter_count

TrainTokens = Callable[[str], "int | None"]
"""The train-split token count of data.prepared, or None (minilmd.corpus_meta.corpus_train_tokens reads it from
meta.json), for the arithmetic of a missing budget."""


@dataclass(frozen=True)
class Range:
    """Where a number must lie; it must also be finite (TOML has nan and inf). Bounds are included unless open."""

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    high_said: str = ""
    """How the message writes `high` (a duration's "7d"), when not as a number."""
    above_why: str = ""
    """Why `high` is the most, said to a value above it."""

    def __str__(self) -> str:
        if math.isinf(self.high):
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        return (f"within {'(' if self.low_open else '['}{_num(self.low)}, {self.high_said or _num(self.high)}"
                f"{')' if self.high_open else ']'}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


INT64_MAX = 2 ** 63 - 1
"""The most a count may be: steps, tokens, epochs and the other counts are stored as int64 (checkpoints' trainer
state, tensors, state.json's readers), and a budget past it would only overflow there, never be reached."""
MAX_DURATION_S = 7 * 86400.0
"""The longest duration (sync.every, the hang timeouts, the backoffs, the GPU poll, checkpoint_every as a time):
a week. A longer one is a slip of the keyboard ("99999999h"): a sync or checkpoint that never comes before the run
ends, a hung trainer left holding its GPU for weeks, a restart nobody is there to see."""

_INT64 = "a count is stored as int64"
AT_LEAST_1 = Range(1, INT64_MAX, above_why=_INT64)
AT_LEAST_0 = Range(0, INT64_MAX, above_why=_INT64)
A_DURATION = Range(0, MAX_DURATION_S, low_open=True, high_said="7d",
                   above_why="a week at most: a longer wait comes after the run, or leaves a hung trainer its GPU")
FINITE_AT_LEAST_0 = Range(0)
FINITE_ABOVE_0 = Range(0, low_open=True)
STEPS_OR_DURATION = ("train.checkpoint_every",)
"""Keys whose integer counts steps (AT_LEAST_1) and whose other values are durations (A_DURATION)."""

RANGES: dict[str, tuple[Range, str]] = {
    "data.val_windows": (AT_LEAST_1, ""),
    "model.hidden_size": (AT_LEAST_1, ""),
    "model.num_hidden_layers": (AT_LEAST_1, ""),
    "model.num_attention_heads": (AT_LEAST_1, ""),
    "model.num_key_value_heads": (AT_LEAST_1, ""),
    "model.vocab_size": (Range(3, 65536), "PAD, BOS and EOS are ids 0-2, and the token stream is uint16"),
    "model.intermediate_size": (AT_LEAST_0, "0: MiniMind's rule"),
    "model.max_position_embeddings": (Range(1, 1 << 20), "the RoPE tables hold max_position_embeddings x head_dim "
                                                         "floats"),
    "model.rope_theta": (FINITE_ABOVE_0, ""),
    "model.rms_norm_eps": (Range(0, 1, low_open=True, high_open=True), ""),
    "train.seq_len": (AT_LEAST_1, ""),
    "train.micro_batch_size": (AT_LEAST_1, ""),
    "train.grad_accum": (AT_LEAST_1, ""),
    "train.lr": (Range(0, 1), "AdamW moves each weight by about lr per step; 0: a sanity run, nothing moves"),
    "train.min_lr_ratio": (Range(0, 1), ""),
    "train.warmup_steps": (AT_LEAST_0, ""),
    "train.weight_decay": (FINITE_AT_LEAST_0, ""),
    "train.grad_clip": (FINITE_AT_LEAST_0, "0: no clipping"),
    "train.max_steps": (AT_LEAST_0, "0: not set"),
    "train.max_tokens": (AT_LEAST_0, "0: not set"),
    "train.max_epochs": (AT_LEAST_0, "0: not set"),
    "train.seed": (Range(0, 2 ** 64 - 1), ""),
    "train.log_every": (AT_LEAST_1, ""),
    "train.eval_every": (AT_LEAST_0, "0: only at each epoch's end and at the end"),
    "train.checkpoint_every": (AT_LEAST_1, "steps as an integer, else a duration"),
    "train.keep_local": (AT_LEAST_1, ""),
    "lora.rank": (AT_LEAST_0, "0: no LoRA"),
    "lora.alpha": (FINITE_ABOVE_0, ""),
    "dpo.beta": (FINITE_ABOVE_0, ""),
    "lora.dropout": (Range(0, 1, high_open=True), ""),
    "early_stop.patience": (AT_LEAST_0, "0: never stop early"),
    "early_stop.min_delta": (FINITE_AT_LEAST_0, ""),
    "eval.warn_rising": (AT_LEAST_1, ""),
    "eval.warn_gap": (FINITE_AT_LEAST_0, ""),
    "eval.update_share_warn": (FINITE_AT_LEAST_0, ""),
    "gpu.count": (AT_LEAST_1, ""),
    "gpu.max_used_mib": (AT_LEAST_0, ""),
    "gpu.max_utilization": (Range(0, 100), "a percentage"),
    "gpu.poll_interval": (A_DURATION, ""),
    "gpu.stable_polls": (AT_LEAST_1, ""),
    "sync.every": (A_DURATION, ""),
    "sync.keep": (AT_LEAST_1, ""),
    "restart.max_restarts": (AT_LEAST_0, ""),
    "restart.backoff_initial": (A_DURATION, "0 would restart in a tight loop"),
    "restart.backoff_max": (A_DURATION, "0 would restart in a tight loop"),
    "restart.no_progress_limit": (AT_LEAST_1, ""),
    "restart.hang_timeout": (A_DURATION, "0 would kill every attempt as hung"),
    "restart.compile_timeout": (A_DURATION, "0 would kill every compiling attempt as hung"),
    "restart.exit_timeout": (A_DURATION, "0 would kill every finishing attempt as hung"),
}
"""Every number of the schema (ints, floats, durations in seconds) and where it must lie, with why when it is not
obvious. One rule for the upper bounds: a count (an int, and max_epochs) at most INT64_MAX, a duration at most
MAX_DURATION_S, any other float finite (Range.holds) and its own bound where it has one (lr, a ratio, a percentage).
tests/test_check_catches.py checks that every numeric field has its row, and the rule."""

CHOICES: dict[str, tuple[tuple, str]] = {
    "data.mode": (DATA_MODES, ""),
    "train.dtype": (("auto", "bf16", "fp32"), ""),
    "train.device": (("auto", "cpu", "cuda"), ""),
    "train.compile": (("auto", True, False), ""),
    "init.checkpoint": (("best", "last"), ""),
    "early_stop.metric": (tuple(EARLY_STOP_METRICS), "the latter for a DPO run"),
}
"""Every key of the schema that takes one of a few values, its choices and why when it is not obvious; beside RANGES.
model.attention (attention_problems) and run.share (minilmd/perms.py) say theirs with their own rules."""


def _choice_text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else f'"{value}"'


def off_choices(cfg: RunConfig) -> list[str]:
    """Every key of CHOICES whose value is not one of its choices, one problem each."""
    return list(_off_choices(cfg).values())


def _off_choices(cfg: RunConfig) -> dict[str, str]:
    p = {}
    for key, (choices, why) in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in choices:
            texts = [_choice_text(c) for c in choices]
            p[key] = (f"{key} = {value!r}: must be {', '.join(texts[:-1])} or {texts[-1]}"
                      + (f" ({why})" if why else ""))
    return p


def out_of_range(cfg: RunConfig) -> list[str]:
    """Every number (RANGES) that is not finite or not in its range, one problem each."""
    return list(_out_of_range(cfg).values())


def _out_of_range(cfg: RunConfig) -> dict[str, str]:
    p = {}
    for key, (allowed, why) in RANGES.items():
        section, name = key.split(".")
        written = value = getattr(getattr(cfg, section), name)
        if key in STEPS_OR_DURATION and not isinstance(value, int):
            allowed = A_DURATION
        if isinstance(value, str):
            try:
                value = parse_duration(value)
            except ValueError as e:
                steps = " (or steps, as an integer: `300` saves every 300 steps, not every 300 seconds)" \
                    if key in STEPS_OR_DURATION else ""
                p[key] = f"{key}: {e}{steps}"
                continue
        if not allowed.holds(value):
            above = math.isfinite(value) and value > allowed.high
            said = "; ".join(w for w in (why, allowed.above_why if above else "") if w)
            p[key] = (f"{key} = {written!r}: must be {'finite and ' if isinstance(written, float) else ''}{allowed}"
                      + (f" ({said})" if said else ""))
    return p


def invalid_fields(cfg: RunConfig, mistyped: Collection[str] = ()) -> set[str]:
    """"section.key" of every field whose value cannot be used: of the wrong type (`mistyped`: config_from_dict
    left its default in place, and a path refused unexpanded), off its choices or out of its range. config_from_dict
    records them on the config (RunConfig._unusable) for `usable`."""
    return set(mistyped) | set(_off_choices(cfg)) | set(_out_of_range(cfg))


def usable(cfg: RunConfig, *keys: str) -> bool:
    """Whether every field of `keys` ("section.key", or "section" for each of its fields) holds a value the config
    accepted. The one rule for a check that derives something from fields (a rule between two of them, a missing
    budget's arithmetic, what the config names on the machine: minilmd/probes.py, daemon/preflight.py): it runs only
    where its fields are usable, else it would judge the default left in place of a value of the wrong type, a -1,
    or a `~/runs` taken literally; and every other check runs, so that every problem is said at once."""
    return not any(f == key or f.startswith(f"{key}.") for f in cfg._unusable for key in keys)


BUDGET_FIELDS = ("train.max_steps", "train.max_tokens", "train.max_epochs", "train.seq_len", "train.micro_batch_size",
                 "train.grad_accum")
"""What a missing budget's message (budget_problem) is derived from."""
DERIVED_FROM = (*BUDGET_FIELDS, *PATH_KEYS, "run.name", "model", "data", "lora", "gpu", "train.device")
"""What the checks that weigh the run as a whole on the machine read (daemon/preflight.py's: scratch's room, the
device's memory, the checkpoint a resume would take, the budget's epochs): they wait while one of these is not
usable (derived_checks_wait)."""


def derived_checks_wait(cfg: RunConfig) -> bool:
    """Whether the checks that weigh the run as a whole (DERIVED_FROM) must wait: a field they read is not usable."""
    return not usable(cfg, *DERIVED_FROM)


def check_values(cfg: RunConfig, train_tokens_of: TrainTokens | None) -> list[str]:
    """Names, choices, every number (RANGES) and the rules between fields, each rule only where its fields are
    usable (config_from_dict has recorded the refused ones), a missing budget too."""
    p: list[str] = []
    r, d, m, t = cfg.run, cfg.data, cfg.model, cfg.train
    if not r.name:
        p.append("run.name is required")
    elif not names.RUN_NAME.fullmatch(r.name):
        p.append(f"run.name = {r.name!r}: use letters, digits, '.', '_' and '-' (it names files and units)")
    if not r.dir:
        p.append("run.dir is required (the local run directory)")
    if share_problem := perms.problem(r.share):
        p.append(share_problem)
    if not d.prepared:
        p.append("data.prepared is required (the output directory of `minilmd prepare`)")
    p += off_choices(cfg)
    if d.doc_mask and d.mode in ONE_DOCUMENT_A_ROW and usable(cfg, "data.doc_mask", "data.mode"):
        p.append(f"data.doc_mask = true needs data.mode = \"packed\" (data.mode = {d.mode!r} already keeps one "
                 "document per row)")
    p += out_of_range(cfg)
    if usable(cfg, "model.hidden_size", "model.num_attention_heads", "model.num_key_value_heads"):
        p += _head_problems(m)
    if usable(cfg, "train.seq_len", "model.max_position_embeddings") and t.seq_len > m.max_position_embeddings:
        p.append(f"train.seq_len {t.seq_len} is larger than model.max_position_embeddings "
                 f"{m.max_position_embeddings}")
    if usable(cfg, "model.attention", "train.deterministic"):
        p += attention_problems(m.attention, t.deterministic)
    if no_budget(cfg) and usable(cfg, *BUDGET_FIELDS):
        p.append(budget_problem(cfg, train_tokens_of(d.prepared) if train_tokens_of and d.prepared else None))
    p += _lora_problems(cfg)
    textfile = cfg.log.prometheus_textfile
    if textfile and not textfile.endswith(".prom"):
        p.append(f"log.prometheus_textfile = {textfile!r}: node_exporter's textfile collector reads only *.prom files")
    rs = cfg.restart
    try:
        initial, cap = rs.backoff_initial_s, rs.backoff_max_s
    except ValueError:
        initial = cap = math.nan  # reported above
    if usable(cfg, "restart.backoff_initial", "restart.backoff_max") and initial > cap:
        p.append(f"restart.backoff_initial {rs.backoff_initial!r} is longer than restart.backoff_max "
                 f"{rs.backoff_max!r}")
    return p


def _head_problems(m: ModelSection) -> list[str]:
    p = []
    if m.num_attention_heads > 0 and m.hidden_size % m.num_attention_heads:
        p.append(f"model.hidden_size {m.hidden_size} is not divisible by num_attention_heads {m.num_attention_heads}")
    elif m.num_attention_heads > 0 and m.head_dim % 2:
        p.append(f"model head_dim {m.head_dim} must be even for RoPE")
    if m.num_key_value_heads > 0 and m.num_attention_heads % m.num_key_value_heads:
        p.append(f"model.num_attention_heads {m.num_attention_heads} is not a multiple of "
                 f"num_key_value_heads {m.num_key_value_heads}")
    return p


def early_stop_metric_problem(cfg: RunConfig, data_format: str) -> str | None:
    """Why early_stop.metric cannot be followed on a corpus of `data_format` ("text", "chat" or "dpo"): a DPO metric
    on a corpus that is not a preference corpus. Said by `run --check` (minilmd/probes.py, from meta.json) and by
    the trainer (minilmd/plan/early_stop.py, from the corpus it opened)."""
    metric = cfg.early_stop.metric
    if metric not in DPO_ONLY_METRICS or data_format == "dpo":
        return None
    return (f"early_stop.metric = {metric!r} needs a preference corpus (`minilmd prepare --format dpo`), but "
            f"data.prepared = {cfg.data.prepared!r} is a {data_format} corpus, whose validation has no rewards: use "
            f"early_stop.metric = \"val_loss\"")


ATTENTION_BACKENDS = ("flash", "efficient", "cudnn", "math")
"""The SDPA backends model.attention may force (torch.nn.attention.SDPBackend's, by their short names)."""
NONDETERMINISTIC_ATTENTION = ("cudnn",)
"""Backends whose backward is not deterministic (torch warns: cuDNN attention's backward "defaults to a
non-deterministic algorithm"; issue 41's measurement): never chosen, nor allowed, with train.deterministic."""


def attention_problems(attention: str, deterministic: bool) -> list[str]:
    if attention != "auto" and attention not in ATTENTION_BACKENDS:
        return [f"model.attention = {attention!r}: must be \"auto\" or one of "
                + ", ".join(f'"{b}"' for b in ATTENTION_BACKENDS)]
    if deterministic and attention in NONDETERMINISTIC_ATTENTION:
        return [f"model.attention = {attention!r} has a non-deterministic backward, and train.deterministic is "
                f"true: use \"auto\" (the fastest deterministic one) or another backend, or set "
                f"train.deterministic = false"]
    return []


def _lora_problems(cfg: RunConfig) -> list[str]:
    lora = cfg.lora
    if not usable(cfg, "lora.targets"):
        return []
    p = [f"lora.targets: {t!r} is not a target (known: {', '.join(LORA_TARGETS)})"
         for t in lora.targets if t not in LORA_TARGETS]
    if len(set(lora.targets)) != len(lora.targets):
        p.append(f"lora.targets = {lora.targets!r}: a target is named twice")
    if not usable(cfg, "lora.rank"):
        return p
    if lora.enabled and not lora.targets:
        p.append("lora.targets is empty: name at least one of " + ", ".join(LORA_TARGETS))
    if lora.enabled and not cfg.init.from_ and usable(cfg, "init.from"):
        p.append(f"lora.rank = {lora.rank} but init.from is empty: a LoRA run trains adapters on a base, which "
                 f"init.from names (a checkpoint, a run's checkpoint root or remote, a MiniMind .pth)")
    if lora.enabled and usable(cfg, "model") and (too_high := _rank_above_layers(cfg)):
        p.append(too_high)
    return p


def _rank_above_layers(cfg: RunConfig) -> str | None:
    """A lora.rank above min(in, out) of a target layer: B A of rank r over an n x m layer is full-rank from
    r = min(n, m) on, so more rank adds parameters and no capacity (a rank of 100,000 on a 532k-parameter model
    trained a 281M-parameter adapter). The run's [model] is its base's (init.from's recorded model config must
    match it: minilmd/init_source.py model_problems), so the bound is known here; None for a model that is no
    model (its own problems say why)."""
    try:
        base = expected_state_shapes(cfg.model)
        adapters = expected_adapter_shapes(cfg.model, cfg.lora)
    except (ValueError, ZeroDivisionError, TypeError):
        return None
    widths: dict[str, int] = {}  # target -> min(in, out) of its layer (A is rank x in, B out x rank)
    for key, shape in adapters.items():
        if key.endswith(".lora_A.weight"):
            widths.setdefault(key.split(".")[-3], min(adapters[key.replace("lora_A", "lora_B")][0], shape[1]))
    if not widths or cfg.lora.rank <= (bound := min(widths.values())) or bound < 1:  # < 1: a model that is none
        return None
    narrowest = [t for t, w in widths.items() if w == bound]
    return (f"lora.rank = {cfg.lora.rank:,} is above {bound:,}, the rank of the narrowest target layer "
            f"({', '.join(narrowest)}: min(in, out) = {bound:,}): past it an adapter adds parameters and no capacity. "
            f"It would train {parameter_count(adapters):,} adapter parameters on a base of "
            f"{parameter_count(base):,}. Set lora.rank to at most {bound:,} (8 to 16 is usual)")


def no_budget(cfg: RunConfig) -> bool:
    """Whether none of train.max_steps, max_tokens, max_epochs is set."""
    t = cfg.train
    return not t.max_steps and not t.max_tokens and not t.max_epochs


def _zero_budgets(cfg: RunConfig) -> str:
    """The budget keys the config set to 0, said first: 0 is how a budget is left unset, so a written 0 is none."""
    zeros = [f"{key} = 0" for key in ("train.max_steps", "train.max_tokens", "train.max_epochs") if cfg.is_set(key)]
    if not zeros:
        return ""
    return f"{' and '.join(zeros)} {'is' if len(zeros) == 1 else 'are'} no budget (0 leaves a budget unset); "


def budget_problem(cfg: RunConfig, train_tokens: int | None = None) -> str:
    """The message for a missing budget, with the arithmetic of what 'no limit' would mean (an epoch of the corpus
    in hours when its train tokens are known). An epoch's steps depend on the data mode's rows, which the plan counts
    (minilmd/plan/budget.py's epoch_without_budget says them, beside this message, where the plan is reachable)."""
    t = cfg.train
    per_step = t.seq_len * t.global_batch(cfg.world_size)
    lines = [_zero_budgets(cfg) + "a budget is required: set a positive train.max_steps, train.max_tokens or "
             f"train.max_epochs. One step trains "
             f"{t.seq_len} x {t.micro_batch_size} x {t.grad_accum} x {cfg.world_size} rank(s) = "
             f"{per_step:,} tokens"]
    if train_tokens:
        lines.append(f"; one epoch of {cfg.data.prepared} ({train_tokens:,} train tokens) at the reference run's "
                     f"measured 3,700 tok/s takes {fmt_duration(train_tokens / 3700)}, so an unlimited default would "
                     f"silently mean that")
    else:
        lines.append("; at 3,700 tok/s (measured on a 768x8 model) a 332M-token corpus is ~25 h per epoch, "
                     "so an unlimited default would silently mean days")
    return "".join(lines)
