"""`[log] tensorboard = true`: the trainer's metrics.jsonl lines also as TensorBoard scalars, rank 0 only.

The event files go to <run.dir>/tensorboard, one file per attempt, all in the same directory: TensorBoard shows
them as one run. A resumed attempt opens its writer with purge_step = the resumed step + 1, so TensorBoard drops
what an earlier attempt logged beyond the checkpoint this one resumed from (those steps are logged again, by the
attempt that went on): every step shows once, with the value of the attempt the run kept. The writer flushes after
every line, so a trainer killed by SIGBUS or SIGKILL loses none that metrics.jsonl has.

The writer is torch.utils.tensorboard's, which needs the `tensorboard` package (`pip install
'minilmd[tensorboard]'`); it is imported only when the option is on, so the trainer's import path gains nothing.
"""
from __future__ import annotations

from minilmd.config import ConfigError, RunConfig
from minilmd.metrics import REWARDS, MetricsLog
from minilmd.names import STATE, STATE_MAX_BYTES, TENSORBOARD_DIR
from minilmd.probes import TENSORBOARD_INSTALL_HINT
from minilmd.untrusted import Unreadable, read_json

SCALARS = {
    "train": {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tok_s": "train/tok_s",
              "mfu": "train/mfu", "peak_mem_gib": "train/peak_mem_gib", "epoch": "train/epoch",
              **{key: f"train/{trl}" for key, trl in REWARDS.items()}},
    "eval": {"val_loss": "val/loss", **{f"val_{key}": f"val/{trl}" for key, trl in REWARDS.items()}},
}
"""metrics.jsonl field -> TensorBoard tag, per kind of line; "run/restarts" is added to every train line. A DPO run's
rewards under TRL's names (train/rewards/accuracies, val/rewards/margins, ...: minilmd.metrics.REWARDS)."""


def restarts_so_far(cfg: RunConfig) -> int:
    """The supervisor's count of restarts (state.json; 0 without a supervisor or a readable state). Read as any
    state.json is (minilmd/untrusted.py: no link followed, a FIFO no hang, its size bounded)."""
    try:
        state = read_json(cfg.run_dir / STATE, max_bytes=STATE_MAX_BYTES)
    except Unreadable:
        return 0
    restarts = state.get("restarts")
    return len(restarts) if isinstance(restarts, list) else 0


class TensorBoardLog(MetricsLog):
    """A MetricsLog that also writes its train and eval lines to a SummaryWriter (rank 0's log only)."""

    def __init__(self, log: MetricsLog, writer, restarts: int):
        super().__init__(log.run_dir, log.active, log.heartbeat_interval, log.writes)
        self.writer = writer
        self.restarts = restarts

    def write(self, kind: str, **fields) -> None:
        super().write(kind, **fields)
        tags = SCALARS.get(kind)
        step = fields.get("step")
        if not tags or not isinstance(step, int):
            return
        for key, tag in tags.items():
            value = fields.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(tag, value, step)
        if kind == "train":
            self.writer.add_scalar("run/restarts", self.restarts, step)
        self.writer.flush()


def tee(log: MetricsLog, cfg: RunConfig, resumed_step: int) -> MetricsLog:
    """log itself, or (with [log] tensorboard on rank 0) log that also writes TensorBoard scalars. Raises
    ConfigError (exit 2: final, a restart would not help) when the tensorboard package is missing."""
    if not cfg.log.tensorboard or not log.active:
        return log
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ConfigError([f"log.tensorboard = true but TensorBoard's writer cannot be imported ({e}): "
                           f"{TENSORBOARD_INSTALL_HINT}"], cfg.source) from None
    # By path, as the run's other files (metrics.jsonl, the logs): run.dir is held to the place rule at run --check,
    # the launch and minilmd train (place_rule.run_dir_problem), so no other user can plant a link in it or above it.
    writer = SummaryWriter(log_dir=str(cfg.run_dir / TENSORBOARD_DIR), purge_step=resumed_step + 1)
    return TensorBoardLog(log, writer, restarts_so_far(cfg))
