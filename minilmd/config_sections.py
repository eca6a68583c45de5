"""The run config's schema: one dataclass per TOML section, their defaults and what each key means, and RunConfig,
which holds them. The bottom of the config's three modules: config_values.py checks the values of a RunConfig and
config.py reads one from TOML; both import this one, which imports neither.

What derives from the values is defined here once, on the section it belongs to, for every caller: each duration in
seconds (`restart.hang_timeout_s`, ...; parse_duration is here for them), checkpoint_every as steps or seconds, the
global batch of a world size and the world size the plan counts (RunConfig.world_size).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Union, cast

from minilmd import scratch_root
from minilmd.names import CHECKPOINTS

Duration = Union[int, float, str]  # noqa: UP007 - _type_ok matches typing.Union; `int | str` would let a bool pass
"""Seconds as a number, or a string such as "90s", "5m", "15m", "2h"."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Duration) -> float:
    """Seconds in a duration: 90, "90s", "5m", "1.5h". Raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a duration cannot be negative: {value!r}")
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"not a duration: {value!r} (use seconds, or a string like \"90s\", \"5m\", \"2h\")")
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The Linear layers of a MiniMind-3 block a LoRA adapter may wrap (the names of HF Qwen3 and PEFT's target_modules)."""


KERNEL_KEYS = ("attention",)
"""[model] keys that choose how the model computes, not what its weights are: a checkpoint or init.from of the same
weights is the same model whatever they say (a resume's kernel is checked apart: Expectation.attention)."""


def weights_config(model: dict) -> dict:
    """A [model] dict (a config's, or one a checkpoint recorded) without KERNEL_KEYS."""
    return {k: v for k, v in model.items() if k not in KERNEL_KEYS}


@dataclass
class RunSection:
    name: str = ""
    """Name of the run; used in the default scratch path and in status. Use the same name for the systemd instance
    (minilmd@NAME runs the config %E/minilmd/NAME.toml: the unit goes by the file's name and never reads this)."""
    dir: str = ""
    """Run directory: run.toml, state.json, events.jsonl, logs, metrics.jsonl, heartbeat, lock. On local disk on one
    server; under Slurm on the shared filesystem (a requeued job may start on another node, which needs them). It and
    every directory above it root's or yours, none another user can rearrange, run.dir itself writable by no other
    user, sticky or not (minilmd/place_rule.py run_dir_problem; not a team directory: run.share shares a run)."""
    scratch: str = ""
    """Fast local storage for the staged corpus and local checkpoints, this run's alone (it carries a marker naming
    run.dir; any other run is refused). Default /dev/shm/minilmd-<uid>/<name>, private to its user (0700)."""
    remote: str = ""
    """Durable storage for checkpoints (an NFS path or an fsspec URL). Empty: no sync."""
    keep_scratch: bool = False
    """Keep scratch once the run has ended. By default a finished run removes its scratch (the staged corpus and
    the local checkpoints, in RAM on /dev/shm) after its last checkpoint is verified on the remote; without a remote,
    or when the last sync failed, scratch is always kept. A run that failed for good removes its staged corpus and
    probe split alone (its checkpoints stay)."""
    share: str = "private"
    """Who may read what the run writes (run.dir, its logs, metrics and TensorBoard files, scratch, the checkpoints
    on the remote, LATEST and BEST): "private" (directories 0700, files 0600), "group" (0750, 0640: your group
    may read them, e.g. for the next stage's init.from or TensorBoard) or "all" (0755, 0644). Applied as they are
    created; your umask can only make them stricter (docs/operations.md, "File permissions")."""


PATH_KEYS = ("run.dir", "run.scratch", "run.remote", "data.prepared", "init.from", "init.staged", "eval.probe",
             "eval.probe_staged", "gpu.lock_dir", "log.prometheus_textfile")
"""The config's keys that name a local path (or a URL, left as it is)."""


DATA_MODES = ("packed", "padded", "bucketed")
"""data.mode's choices (DataSection.mode says each); the samplers' (minilmd/plan/samplers.py) and the row counts'
(minilmd/rowcount.py)."""
ONE_DOCUMENT_A_ROW = ("padded", "bucketed")
"""The data modes whose row is one document (data.doc_mask has nothing to cut there)."""


@dataclass
class DataSection:
    prepared: str = ""
    """The output directory of `minilmd prepare` (local path or fsspec URL); the supervisor stages it to scratch."""
    mode: str = "packed"
    """"packed": fixed windows across document boundaries (no PAD). "padded": one document per row padded to
    seq_len (MiniMind's). "bucketed": one document per row, micro-batches of similar lengths padded to their longest
    row (the SFT default: see SFT_DEFAULTS)."""
    val_windows: int = 64
    """Number of fixed validation windows (or documents, in padded mode) for the validation loss."""
    doc_mask: bool = False
    """Packed mode only: each token attends only to earlier tokens of its own document and its rotary positions
    restart at the document's BOS, so a packed window computes what its documents would alone (block-causal
    attention; the EOS -> next BOS prediction is dropped). Costs a dense mask per row on CPU (docs/training.md,
    "Document masking"). On a chat corpus: padding-free SFT, whole conversations packed into rows (then data.mode
    stays "packed", not SFT_DEFAULTS' "bucketed"). Recorded in checkpoints: a resume with the other setting is
    refused."""


@dataclass
class ModelSection:
    hidden_size: int = 768
    """Width of the residual stream."""
    num_hidden_layers: int = 8
    """Number of transformer blocks."""
    num_attention_heads: int = 8
    """Query heads; head_dim = hidden_size / num_attention_heads."""
    num_key_value_heads: int = 4
    """Key/value heads (grouped-query attention); must divide num_attention_heads."""
    vocab_size: int = 6400
    """Must equal the tokenizer's vocabulary size."""
    intermediate_size: int = 0
    """SwiGLU width; 0 means MiniMind's ceil(hidden_size * pi / 64) * 64 (2432 at 768)."""
    max_position_embeddings: int = 32768
    """Longest sequence the model accepts; seq_len may not exceed it."""
    rope_theta: float = 1e6
    """RoPE base frequency."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    attention: str = "auto"
    """The SDPA kernel: "auto" (on CUDA the fastest backend, deterministic ones only with train.deterministic, timed
    at the first start; on the CPU torch's own) or one forced: "flash", "efficient", "cudnn", "math". Recorded in
    checkpoints and kept by a resume; forcing another one then is refused (trainer/model/attention_choice.py)."""

    @property
    def ffn_size(self) -> int:
        if self.intermediate_size:
            return self.intermediate_size
        return int(math.ceil(self.hidden_size * math.pi / 64) * 64)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass
class TrainSection:
    seq_len: int = 340
    """Tokens per training row (the reference run's corpus: T=340)."""
    micro_batch_size: int = 32
    """Rows per forward/backward on one device (pairs in DPO). One whose memory estimate is over twice what the
    device offers is refused at `run --check`, the launch and the trainer's start (minilmd/plan/footprint.py)."""
    grad_accum: int = 1
    """Micro-batches accumulated per optimizer step. Global batch = micro_batch_size * grad_accum * world_size."""
    lr: float = 5e-4
    """Peak learning rate: pretraining's default here; a chat or preference corpus's stage has its own where the
    config leaves this out (minilmd/config.py, stage_defaults: SFT 1e-5, LoRA SFT 1e-4, DPO 1e-5, LoRA DPO 3e-4),
    and a resumed run keeps the one its checkpoints record. 0: a sanity run whose weights do not move (`run --check`
    warns)."""
    min_lr_ratio: float = 0.1
    """The cosine schedule ends at lr * min_lr_ratio."""
    warmup_steps: int = 0
    """Linear warmup steps before the cosine decay."""
    weight_decay: float = 0.1
    """AdamW weight decay (applied to matrices only, not to norms)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    dtype: str = "auto"
    """"auto" (bf16 autocast on CUDA, fp32 on CPU), "bf16" or "fp32"."""
    max_steps: int = 0
    """Stop after this many optimizer steps (0: not set). A budget (max_steps, max_tokens or max_epochs) is
    required; with several, whichever ends first."""
    max_tokens: int = 0
    """Stop once this many tokens were trained on (0: not set); converted to steps at start."""
    max_epochs: float = 0.0
    """Stop after this many passes over the train split (0: not set; fractions allowed): ceil(max_epochs x rows
    per epoch / global batch) steps, rows being windows (packed) or documents (padded, bucketed)."""
    seed: int = 1337
    """Seed of the model init and of the data order."""
    device: str = "auto"
    """"auto" (CUDA if the supervisor or torch finds a GPU, else CPU), "cpu" or "cuda"."""
    log_every: int = 10
    """Append a line to metrics.jsonl every this many steps."""
    eval_every: int = 500
    """Compute the validation loss every this many steps, and at each epoch's end and at the end (0: only at each
    epoch's end and at the end)."""
    checkpoint_every: Duration = "5m"
    """Save a local checkpoint every N steps (an integer) or every duration (a string such as "5m")."""
    keep_local: int = 2
    """Number of valid local checkpoints kept in scratch."""
    deterministic: bool = True
    """On CUDA: deterministic algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8 before CUDA starts and deterministic
    attention kernels, so a killed-and-resumed GPU run ends bit-identical to an undisturbed one (docs/training.md,
    "Bit-exact on the GPU"); the CPU is bit-exact either way. Recorded in checkpoints: a change on resume is refused."""
    compile: Union[bool, str] = "auto"  # noqa: UP007 - _type_ok matches typing.Union
    """torch.compile the model: "auto" (on CUDA, not on CPU), true or false. Its first step compiles; the
    supervisor allows restart.compile_timeout for it."""

    @property
    def checkpoint_every_steps(self) -> int | None:
        """checkpoint_every as steps, when it is an integer; None when it is a duration (checkpoint_every_s)."""
        every = self.checkpoint_every
        return every if isinstance(every, int) else None

    @property
    def checkpoint_every_s(self) -> float | None:
        """checkpoint_every in seconds, when it is a duration; None when it counts steps."""
        return None if self.checkpoint_every_steps is not None else parse_duration(self.checkpoint_every)

    def global_batch(self, world_size: int) -> int:
        """Rows one optimizer step trains over `world_size` ranks: the trainer's (its real ranks) and the plan's
        (RunConfig.world_size)."""
        return self.micro_batch_size * self.grad_accum * world_size


@dataclass
class InitSection:
    from_: str = ""
    """TOML key `from`. Where a fresh run takes its weights instead of the seeded init: another run's config file or
    run directory (its final synced checkpoint, once it has finished: the supervisor waits in waiting_init, and stops
    with exit 2 if that run failed), a checkpoint directory (step-XXXXXXXX/), a run's checkpoint root or remote (the
    checkpoint init.checkpoint picks: its BEST by default when it has one, else its LATEST), or a MiniMind .pth. The
    optimizer starts fresh at step 0; the source's fingerprint is recorded in every checkpoint of this run. Its
    model config must be this run's. Read once: a run that has a checkpoint resumes from it and never reads this
    again (the source may be deleted then); except a LoRA run ([lora] rank > 0), whose frozen base is loaded at
    every start (trainer/loop/resume.py, start_lora): under a supervisor from the copy staged in scratch
    (<scratch>/init; gone or damaged, staged again from the copy the sync keeps in <remote>/init, else from this
    source), while `minilmd train` on its own reads this source at every start, so it must stay as long as the run
    lives. Empty: the seeded init."""
    checkpoint: str = "best"
    """Which checkpoint of a run or checkpoint root init.from takes: "best", the one its BEST names when it has one
    (the best validation of a run with [early_stop], by its early_stop.metric; an early-stopped run's LATEST is
    `patience` evals past it), else its LATEST; "last", always its LATEST. A checkpoint directory, a pointer file
    or a .pth is taken as named."""
    staged: str = ""
    """Set by the supervisor, not by hand: the verified copy of init.from's weights in scratch
    (daemon/jobs/initstage.py), which the trainer reads instead; init.from stays what the run records."""


@dataclass
class EarlyStopSection:
    patience: int = 0
    """Stop (exit 0, saved and synced like a finished run) after this many validations in a row without a new best
    of `metric`; 0: never stop early. Validation runs every train.eval_every steps and at each epoch's end."""
    min_delta: float = 0.0
    """A validation counts as a new best only if it beats the best by more than this."""
    metric: str = "val_loss"
    """What "best" means, for the patience count and the checkpoint BEST names (which `init.checkpoint = "best"` of
    a later stage takes): "val_loss" (lower is better), or for a DPO run (a corpus of `prepare --format dpo`)
    "val_reward_accuracy" (higher is better: the share of val pairs whose chosen reply's reward is above the
    rejected one's)."""


EARLY_STOP_METRICS = {"val_loss": "lower", "val_reward_accuracy": "higher"}
"""early_stop.metric's choices, and which way is better."""
DPO_ONLY_METRICS = ("val_reward_accuracy",)
"""The metrics only a preference corpus's validation gives."""


@dataclass
class EvalSection:
    probe: str = ""
    """A prepared corpus of an earlier stage (its val split, e.g. the pretraining corpus): its loss is evaluated
    with the val loss and shown by `status`, so that forgetting shows as the probe loss rising. Empty: none."""
    probe_staged: str = ""
    """Set by the supervisor, not by hand: the verified copy of the probe's val split in scratch, read instead."""
    warn_rising: int = 3
    """`status` warns when the val loss rose this many validations in a row."""
    warn_gap: float = 0.5
    """`status` warns when the val loss exceeds the train loss of the same epoch by more than this, and the gap grew
    by more than this since the first epoch or the val loss rose above its lowest (daemon/views/fitwatch.py). A DPO
    run that leaves it unset is warned at 0.1 (its loss starts at ln 2 = 0.69: DPO_WARN_GAP there)."""
    update_share_warn: float = 0.1
    """`run --check` warns when this run's sample updates exceed this share of those of the run init.from comes
    from (the seed's style SFT took 0.24 and erased the base's abilities)."""




@dataclass
class DpoSection:
    beta: float = 0.1
    """DPO's beta on a preference corpus (`prepare --format dpo`): how far from the reference (the init.from model)
    the policy may move for a given preference; the rewards are beta x the log-probability ratios. 0.1 is the DPO
    paper's and TRL's default; MiniMind's train_dpo.py uses 0.15 (with lr 4e-8)."""


@dataclass
class LoraSection:
    rank: int = 0
    """Rank r of the low-rank bypass B A added to each target (PEFT's `r`). 0: no LoRA, every weight trains. Above
    0: init.from names the base, which is frozen; only the adapters train and only they are checkpointed. At most
    min(in, out) of the narrowest target layer (its full rank; a higher rank is refused: config_values.py)."""
    alpha: float = 16.0
    """The bypass is scaled by alpha / rank (PEFT's `lora_alpha`)."""
    dropout: float = 0.0
    """Dropout on the input of A while training (PEFT's `lora_dropout`)."""
    targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    """The Linear layers of every block that get an adapter, among LORA_TARGETS (PEFT's `target_modules`)."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class GpuSection:
    count: int = 1
    """Number of GPUs to use (torchrun when more than one)."""
    max_used_mib: int = 200
    """A GPU is free only if at most this much of its memory is used."""
    max_utilization: int = 0
    """A GPU is free only if its utilisation (percent) is at most this."""
    poll_interval: Duration = "30s"
    """Time between two NVML polls while waiting."""
    stable_polls: int = 3
    """A GPU must look free this many polls in a row before it is taken."""
    lock_dir: str = "/tmp/minilmd-gpu-locks"
    """Shared directory of per-device lease files, so that two minilmd runs never take the same card."""

    @property
    def poll_interval_s(self) -> float:
        return parse_duration(self.poll_interval)


@dataclass
class SyncSection:
    every: Duration = "15m"
    """Copy the newest valid local checkpoint to run.remote this often."""
    keep: int = 3
    """Valid checkpoints kept on the remote."""

    @property
    def every_s(self) -> float:
        return parse_duration(self.every)


@dataclass
class RestartSection:
    max_restarts: int = 100
    """Give up (exit status 79) after this many restarts in total."""
    backoff_initial: Duration = "5s"
    """First wait before a restart; doubled each time (with jitter) up to backoff_max."""
    backoff_max: Duration = "10m"
    """Longest wait between restarts."""
    no_progress_limit: int = 5
    """Give up after this many restarts in a row that produced no new checkpoint."""
    hang_timeout: Duration = "10m"
    """A trainer whose heartbeat is older than this is hung: its stack is dumped and its group killed."""
    compile_timeout: Duration = "30m"
    """While the trainer's heartbeat says it is compiling (its first torch.compile'd step), it is hung only
    after this long (or hang_timeout, if longer)."""
    exit_timeout: Duration = "10m"
    """Once the trainer's heartbeat says it is exiting (training over, the final checkpoint saved), it is hung only
    after this long (or hang_timeout, if longer): a torchrun group's teardown (NCCL) can take minutes."""

    # Each duration in seconds (the config check has parsed them all: config_values.RANGES).
    @property
    def backoff_initial_s(self) -> float:
        return parse_duration(self.backoff_initial)

    @property
    def backoff_max_s(self) -> float:
        return parse_duration(self.backoff_max)

    @property
    def hang_timeout_s(self) -> float:
        return parse_duration(self.hang_timeout)

    @property
    def compile_timeout_s(self) -> float:
        return parse_duration(self.compile_timeout)

    @property
    def exit_timeout_s(self) -> float:
        return parse_duration(self.exit_timeout)


@dataclass
class LogSection:
    tensorboard: bool = False
    """Write the trainer's scalars (loss, val loss, lr, grad norm, tok/s, MFU, restarts) as TensorBoard event files
    under <run.dir>/tensorboard (rank 0; needs the `tensorboard` package: pip install 'minilmd[tensorboard]')."""
    prometheus_textfile: str = ""
    """A file the supervisor rewrites atomically with `minilmd_*` gauges for node_exporter's textfile collector
    (e.g. /var/lib/node_exporter/textfile/minilmd-NAME.prom; the name must end in .prom). Empty: none."""


@dataclass
class RunConfig:
    run: RunSection = field(default_factory=RunSection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    init: InitSection = field(default_factory=InitSection)
    lora: LoraSection = field(default_factory=LoraSection)
    dpo: DpoSection = field(default_factory=DpoSection)
    early_stop: EarlyStopSection = field(default_factory=EarlyStopSection)
    eval: EvalSection = field(default_factory=EvalSection)
    gpu: GpuSection = field(default_factory=GpuSection)
    sync: SyncSection = field(default_factory=SyncSection)
    restart: RestartSection = field(default_factory=RestartSection)
    log: LogSection = field(default_factory=LogSection)
    source: str = ""
    """The file this config was read from (not a TOML key)."""
    _explicit = frozenset[str]()  # not a field: "section.key" of every key the TOML or a --set gave
    _tables = frozenset[str]()  # not a field: every [section] the TOML writes, keys in it or none
    _unusable = frozenset[str]()  # not a field: "section.key" of each value refused (config_values.usable)

    def is_set(self, key: str) -> bool:
        """Whether "section.key" was written in the config or given with --set (not left to its default)."""
        return key in self._explicit

    def section_written(self, section: str) -> bool:
        """Whether the config writes a [section] table (an empty one too: a bare `[dpo]` says what the file means)
        or sets one of its keys (in the file or with --set)."""
        return section in self._tables or any(key.startswith(f"{section}.") for key in self._explicit)

    def override(self, key: str, value: Any) -> None:
        """Set "section.key" as a --set would (so that defaults such as SFT_DEFAULTS leave it alone)."""
        section, name = key.split(".")
        setattr(getattr(self, section), name, value)
        self._explicit = self._explicit | {key}

    _scratch_root = cast("Path | None", None)  # not a field: the root the launch settled (fix_scratch_root), or
    # the one the first look found

    def fix_scratch_root(self, root: Path) -> None:
        """The per-user root of a default scratch from now on, as the launch settled it (scratch_root.settle):
        record not read again, so no later read error can move this run's scratch elsewhere."""
        self._scratch_root = root

    @property
    def scratch_dir(self) -> Path:
        return self._default_scratch if self.scratch_root_settled else Path(self.run.scratch)

    @property
    def scratch_root_settled(self) -> bool:
        """Whether the launch settles the scratch's root (scratch_root.settle: a private one where another user took
        the default's): run.scratch unset, or set directly in the per-user default root (in_default_root)."""
        return not self.run.scratch or scratch_root.in_default_root(Path(self.run.scratch))

    @property
    def scratch_is_default(self) -> bool:
        """The per-user default (also when written out, or passed to a trainer): its root must be private to this
        user. Reads nothing (scratch_root.is_default_form)."""
        return not self.run.scratch or scratch_root.is_default_form(Path(self.run.scratch), self.run.name)

    @property
    def _default_scratch(self) -> Path:
        """In the root the launch settled (fix_scratch_root); before it, or in another command (status, sample),
        in the private root run.dir records when another user took the default's (minilmd/scratch_root.py:
        RecordUnreadable when that record cannot be read)."""
        if self._scratch_root is None:  # looked up once: every later look of this config sees the same root
            self._scratch_root = scratch_root.root(self.run_dir if self.run.dir else None)
        if self.run.scratch:  # its own name, in the settled root
            return self._scratch_root / Path(self.run.scratch).name
        return scratch_root.default_path(self.run.name, in_root=self._scratch_root)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir)

    @property
    def checkpoint_dir(self) -> Path:
        """Local checkpoints, in scratch."""
        return self.scratch_dir / CHECKPOINTS

    @property
    def world_size(self) -> int:
        """The trainer processes the supervisor launches for this config, as the plan counts them: one per leased
        GPU (gpu.count), one on the CPU (train.device = "cpu": no lease, daemon/phases/gpuwait.py). What trains
        elsewhere counts the ranks it has: "auto" finding no GPU (one process), a Slurm allocation, a hand torchrun."""
        return 1 if self.train.device == "cpu" else max(self.gpu.count, 1)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source")
        return {section: {toml_key(k): v for k, v in body.items()} for section, body in d.items()}

    def model_dict(self) -> dict:
        """The [model] keys that make the weights (what checkpoints and init.from are compared on): not the kernel
        attention runs (KERNEL_KEYS)."""
        return weights_config(dataclasses.asdict(self.model))

    def lora_dict(self) -> dict | None:
        """The [lora] section as a dict when LoRA is on, else None (what checkpoints are checked against)."""
        return dataclasses.asdict(self.lora) if self.lora.enabled else None


SECTIONS = {f.name: f.type for f in fields(RunConfig) if f.name != "source"}


def toml_key(field_name: str) -> str:
    """The TOML key of a dataclass field: a Python keyword (`from`) is spelt with a trailing underscore in Python."""
    return field_name.removesuffix("_")
