"""What the training loop reports (the Trainer's `reports`, trainer/loop/train.py): metrics.jsonl's train lines (loss,
rate, grad norm, throughput, the objective's metrics, MFU and peak memory on CUDA), when to validate, the eval lines
(validation loss and metrics, [eval] probe's loss) with the best so far followed (EarlyStop, BEST kept through the
saves), and the early stop's line. Rank 0 validates and writes; every rank learns the outcome.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as torch_dist

from minilmd.config import RunConfig
from minilmd.metrics import MetricsLog, Throughput
from minilmd.names import HEARTBEAT_EXITING
from minilmd.plan.early_stop import EarlyStop
from minilmd.plan.mfu import flops_per_token, mfu, peak_flops
from minilmd.trainer.loop import step as optimizer_step
from minilmd.trainer.loop.components import parameter_split
from minilmd.trainer.loop.distributed import Dist
from minilmd.trainer.loop.guards import LossGuard
from minilmd.trainer.loop.saving import Saves


class Reports:
    """The run's metrics and evaluations. `epoch_of(step)` is the epoch a step starts in; `validate()` gives the
    validation (loss, metrics) and `probe()` [eval] probe's loss (None without probe rows), both asked on rank 0;
    `model` and `matmul` (the dtype of its matmuls) give MFU's figures."""

    def __init__(self, cfg: RunConfig, dist: Dist, log: MetricsLog, early: EarlyStop, saves: Saves,
                 loss_guard: LossGuard, total_steps: int, epoch_of: Callable[[int], int],
                 validate: Callable[[], optimizer_step.Evaluation], probe: Callable[[], float] | None,
                 model: torch.nn.Module, matmul: str):
        self.cfg, self.dist, self.log, self.early, self.saves = cfg, dist, log, early, saves
        self.loss_guard, self.total_steps, self.epoch_of = loss_guard, total_steps, epoch_of
        self.validate, self.probe = validate, probe
        self.device = dist.device
        # MFU's figures: the model's FLOPs per token and, on a known CUDA device, its peak at the `matmul` dtype
        m, t = cfg.model, cfg.train
        self.flops_per_token = flops_per_token(*parameter_split(model), m.num_hidden_layers,
                                               m.num_attention_heads * m.head_dim, t.seq_len)
        self.peak_flops = (peak_flops(torch.cuda.get_device_name(self.device), matmul,
                                      tf32=torch.get_float32_matmul_precision() != "highest")
                           if self.device.type == "cuda" else None)

    def log_train(self, step: int, tokens_seen: int, lr: float, step_metrics: dict[str, torch.Tensor],
                  loss_sum: torch.Tensor, grad_norm: torch.Tensor, meter: Throughput) -> None:
        """The train line of the step just taken (`step` steps done); every rank takes part (the loss is reduced)."""
        if self.dist.active:
            torch_dist.all_reduce(loss_sum)  # each rank holds its share of the global mean
        loss = float(loss_sum)
        self.loss_guard.require_finite(step, loss)  # the mean over ranks: any rank's share non-finite
        tok_s, step_time, apart = meter.report()  # training time only: eval, save, compile apart (metrics.py)
        fields = dict(step=step, tokens_seen=tokens_seen, loss=round(loss, 6),
                      lr=lr, grad_norm=round(float(grad_norm), 6), tok_s=round(tok_s, 1),
                      step_time=round(step_time, 5), **apart, total_steps=self.total_steps,
                      epoch=self.epoch_of(step - 1), **optimizer_step.metric_fields(step_metrics, self.dist))
        if self.device.type == "cuda":
            if self.peak_flops:
                fields["mfu"] = round(mfu(tok_s, self.flops_per_token, self.peak_flops, self.dist.world_size), 4)
            fields["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 3)
        self.log.write("train", **fields)
        if self.dist.is_main:
            print(f"step {step}/{self.total_steps} loss {loss:.4f} lr {lr:.2e} "
                  f"grad_norm {float(grad_norm):.3f} {tok_s:,.0f} tok/s", flush=True)

    def eval_due(self, step: int) -> bool:
        """Every eval_every steps and at each epoch's end (but the last step, validated after the final save)."""
        every = self.cfg.train.eval_every
        if step == self.total_steps:
            return False
        return bool(every and step % every == 0) or self.epoch_of(step) != self.epoch_of(step - 1)

    def log_eval(self, step: int) -> bool:
        """Validate (rank 0), follow the best (EarlyStop) and keep its checkpoint (BEST) when early_stop is on.
        Returns whether the run stops early, the same on every rank."""
        improved = stop = False
        if self.dist.is_main:
            self.log.heartbeat(step, force=True)  # an evaluation can outlast many steps
            val_loss, val_metrics = self.validate()
            validation = {"val_loss": val_loss, **optimizer_step.metric_fields(val_metrics, prefix="val_")}
            improved = self.early.update(step, validation)
            stop = self.early.should_stop
            probe = {"probe_loss": round(self.probe(), 6)} if self.probe else {}
            self.log.write("eval", step=step, epoch=self.epoch_of(step - 1),
                           **{**validation, "val_loss": round(val_loss, 6)}, **self.early.best_fields(), **probe)
            print(f"step {step} val_loss {val_loss:.4f}"
                  + (f" probe_loss {probe['probe_loss']:.4f}" if probe else "")
                  + (" (best)" if improved else f" (best {self.early.best_said()})"), flush=True)
        if self.dist.active:
            flags = [improved, stop]
            torch_dist.broadcast_object_list(flags, src=0)
            improved, stop = flags
        if improved and self.early.enabled:
            self.saves.mark_best(step)
        return stop

    def stop_early(self, step: int) -> None:
        """early_stop.patience validations without a new best: save (if this step is not saved) and finish."""
        e = self.early
        if self.dist.is_main:
            self.log.write("early_stop", step=step, metric=e.metric, **e.best_fields(), patience=e.patience)
            print(f"minilmd: early stop at step {step}: no new best {e.metric} for {e.since_best} validations; "
                  f"the best, {e.best_said()}, is BEST", flush=True)
        self.saves.finish(step, HEARTBEAT_EXITING)
