"""`minilmd train CONFIG`: the training loop, on one device or one rank per device under torchrun.

Built once, in order (Trainer.__init__):
    the corpus, its stage's defaults, its sampler, the validation rows and the parts (_open_data);
    the model from the seeded init, on the device, and its optimizer (_build_model);
    resume from the newest valid checkpoint (model, optimizer, and the parts' state: step, sampler, RNG, early
        stop; trainer/loop/parts.py), or start at step 0 from the weights of [init] from (a fresh optimizer) or keep
        the seeded init (trainer/loop/resume.py);
    what runs the steps (_build_runtime): the attention kernel, the checkpoints (trainer/loop/saving.py), the
        (compiled, DDP) forward in the StepSetup every step of the attempt runs with, the reports (metrics and
        evaluations, MFU's figures: trainer/loop/reporting.py);
    DPO: its reference, read back or computed and saved at step 0 (trainer/loop/dpo_reference.py).
The loop, top to bottom (Trainer.train):
    bucketed: one forward+backward at the widest width, no step (trainer/loop/warmup.py);
    until the budget is spent:
        agree across ranks on "stop requested?" and "checkpoint due?" (trainer/loop/saving.py);  stop -> save, exit 75
        one optimizer step (trainer/loop/step.py): micro-batches of the pure-function sampler, each loss the
            objective's (trainer/loop/objective.py) summed over its targets inside the (compiled) module of model and
            objective, divided by the global batch's count of targets,
            backward (no DDP sync until the last micro-batch), clip, AdamW at the cosine rate for this step
        a non-finite loss stops the run; heartbeat (about once a second; "compiling" over each compiled step
            that brings a new width); every log_every steps a metrics line; every eval_every steps the validation loss
            (a new best is saved as BEST; early_stop.patience validations without one: save, exit 0): the reports
            (trainer/loop/reporting.py)
    save, validation loss, exit 0.
Everything the math depends on derives from (seed, step) or from restored state, never from the wall clock (a
duration-based checkpoint_every only changes when saves happen), so on CPU a killed-and-resumed run ends with the
same weights, bit for bit, as an uninterrupted one. Ranks, process groups and DDP: trainer/loop/distributed.py.

Exit statuses (protocol.py): 0 budget reached and saved; 75 stopped by SIGTERM/SIGINT after saving at a step
boundary (during DPO's reference pass: after its batch, step 0 saved with the sums so far, the next start goes on
from there); 73 the same stop and save on a full run.dir (guards.py: its writes there are dropped meanwhile); 76 CUDA
out of memory in any of its shapes (minilmd/cuda_oom.py; fault.json written first); 74 a checkpoint did not fit in
scratch (or run.dir could not be made: its file system full); 2 bad config
(also: the newest checkpoint is of another model config; model.vocab_size other than the corpus's; a ValueError from
building the model or its optimizer, which would come again on every restart; scratch belonging to another run); 65
bad data (also: it was trained on another corpus or tokenizer; a token id beyond the corpus's own vocabulary, found
when the corpus is opened); 1 anything else, which the supervisor retries. A failure's: trainer/loop/exits.py.
Signal handlers only set a flag. SIGUSR1 dumps every thread's stack to stderr (faulthandler) so that a supervisor
can see where a hung trainer is stuck before killing it.
The process around the Trainer (main(), run(): run.dir settled, scratch claimed and locked, the ranks, each failure's
exit status, the handlers): trainer/loop/entry.py.
"""
from __future__ import annotations

import gc
from typing import Any

import torch
import torch.nn.functional  # imported early: the model uses it

from minilmd.batch_stream import MATMUL, change_note, stream_changes, stream_record
from minilmd.checkpoint import Expectation
from minilmd.config import ConfigError, RunConfig, apply_stage_defaults, keep_recorded_schedule
from minilmd.corpus_meta import CORPUS_SUMMARY, corpus_summary
from minilmd.metrics import MetricsLog, Throughput, heartbeat_interval
from minilmd.names import HEARTBEAT_EXITING
from minilmd.plan.bucketing import BucketedSampler, check_replies_fit
from minilmd.plan.budget import total_steps_for_budget
from minilmd.plan.early_stop import EarlyStop, probe_batches
from minilmd.plan.sampler_base import Batch, Sampler
from minilmd.plan.samplers import make_sampler, validation_batches
from minilmd.plan.schedule import lr_at
from minilmd.protocol import (
    EXIT_DONE,
)
from minilmd.supervision import supervision
from minilmd.trainer.checkpoint.save import AsyncCheckpointer
from minilmd.trainer.loop import exits, tensorboard, warmup
from minilmd.trainer.loop import step as optimizer_step
from minilmd.trainer.loop.components import build_optimizer, compile_enabled
from minilmd.trainer.loop.distributed import Dist, wrap_ddp
from minilmd.trainer.loop.dpo_reference import Preference
from minilmd.trainer.loop.faults import FaultInjector
from minilmd.trainer.loop.guards import LossGuard, StopFlag
from minilmd.trainer.loop.objective import DeviceBatch, TrainingForward, build_objective
from minilmd.trainer.loop.parts import Found, RngState, SamplerCursor, Stateful, TrainState
from minilmd.trainer.loop.reporting import Reports
from minilmd.trainer.loop.resume import announce, load_model_state, resume, start_from_init, start_lines, start_lora
from minilmd.trainer.loop.saving import Saves
from minilmd.trainer.model import attention_choice
from minilmd.trainer.model.lora import adapter_state_dict


class Trainer:
    """One training run: the components, then train() (the loop in the module docstring). What a checkpoint carries
    of the run besides the model and the optimizer lives in parts that own it (trainer/loop/parts.py): `state`
    (step, rows, tokens seen, init record), `cursor` (the sampler), `rng` and `early` (early stop)."""

    state: TrainState  # set by _open_data, which __init__ calls first

    def __init__(self, cfg: RunConfig, dist: Dist, stop: StopFlag | None = None):
        self.cfg, self.dist, self.stop = cfg, dist, stop or StopFlag()
        self.device = dist.device
        self.log = MetricsLog(cfg.run_dir, active=dist.is_main, writes=self.stop.writes,
                              heartbeat_interval=heartbeat_interval(cfg.restart.hang_timeout_s))
        self.faults = FaultInjector(cfg.run_dir, enabled=dist.is_main)
        self._open_data()
        self._build_model()
        found = resume(cfg, dist, self.expectation())
        self.resumed_from = found.path if found else None
        if found:
            self.apply_resume(found)
        elif cfg.init.from_ and not cfg.lora.enabled:
            self.state.init_record = start_from_init(cfg, self.model, dist)
        self._build_runtime(found)
        if self.preference:  # DPO: the reference read back, or computed now and saved at step 0
            self.start_reference(found)

    def start_reference(self, found: Found | None) -> None:
        """DPO's reference (trainer/loop/dpo_reference.py): read back from the checkpoint resumed, or computed now
        (or the rest of a pass a stop or a kill cut short) and then saved at step 0 (replacing the step 0 of that
        pass: the same weights, the whole of the sums). The pass saves step 0 with the sums computed so far and how
        far it got every checkpoint_every (Saves.pass_due), and at a stop, so the next start goes on from there;
        StoppedInPass then ends the run (exit 75, or 73 on a full run.dir)."""
        assert self.preference is not None
        try:
            self.val_batches, files = self.preference.start(self, found)
        except exits.StoppedInPass as stopped:
            self.saves.save_pass(self.step, stopped.kept, stopped.done, stopped.total)
            self.saves.finish(self.step)
            raise
        self.saves.pass_complete(files)
        if self.preference.seconds is not None:  # computed now: kept with the run from here on
            self.save()

    def _open_data(self) -> None:
        """The corpus, its stage's defaults, the sampler (its cursor), the validation and probe rows, the parts'
        state and the objective."""
        from minilmd.corpus.format import open_prepared

        cfg, t = self.cfg, self.cfg.train
        self.corpus = open_prepared(cfg.data.prepared)
        if self.corpus.vocab_size != cfg.model.vocab_size:
            raise ConfigError([f"model.vocab_size = {cfg.model.vocab_size} but the corpus {cfg.data.prepared} was "
                               f"tokenized with a vocabulary of {self.corpus.vocab_size}"], cfg.source)
        # Before anything reads the mode or the rates; the config recorded in the checkpoints says what was used.
        self.stage_defaults = apply_stage_defaults(cfg, self.corpus.data_format)
        train, val = self.corpus.train, self.corpus.val
        self.preference = Preference.of(cfg, self.corpus, self.dist.is_main)  # a preference corpus: DPO's pairs
        sampler = self.preference.sampler if self.preference else make_sampler(
            cfg.data.mode, train.tokens, train.doc_starts, t.seq_len, t.seed, train.loss_mask, t.micro_batch_size,
            cfg.data.doc_mask)
        check_replies_fit(sampler, val, self.corpus.meta, cfg, self.dist.is_main)  # SFT's replies seq_len cuts
        self.cursor = SamplerCursor(sampler, self.corpus, cfg.data.mode, t.seq_len, t.seed, t.micro_batch_size,
                                    cfg.data.doc_mask)
        self.val_batches = [] if self.preference else validation_batches(  # DPO's: once its reference is known
            cfg.data.mode, val.tokens, val.doc_starts, t.seq_len, cfg.data.val_windows, t.micro_batch_size,
            val.loss_mask, cfg.data.doc_mask)
        self.probe_batches = probe_batches(cfg)
        self.early = EarlyStop.from_config(cfg, self.corpus.data_format)
        self.rng = RngState()
        self.state = TrainState(global_batch=t.global_batch(self.dist.world_size), seq_len=t.seq_len)
        self.rows_per_epoch = self.sampler.items_per_epoch  # of this corpus, as cut today (a resume counts by it too)
        self.total_steps = total_steps_for_budget(cfg, self.global_batch, self.rows_per_epoch)
        self.objective = build_objective(cfg, self.corpus.data_format)

    def _build_model(self) -> None:
        """The model from the seeded init (a LoRA run's adapters on its base) on the device, and its optimizer."""
        from minilmd.trainer.model.minimind import MiniMindForCausalLM

        cfg = self.cfg
        torch.manual_seed(cfg.train.seed)  # the init is drawn on CPU: the same weights on every device and rank
        try:
            self.model = MiniMindForCausalLM(cfg.model)
            if cfg.lora.enabled:
                self.state.init_record = start_lora(cfg, self.model, self.dist)
            self.model.to(self.device)
            self.optimizer = build_optimizer(self.model, cfg, self.device)
        except ConfigError:  # a LoRA base that init.from cannot give: its own words, which name it
            raise
        except ValueError as e:  # torch refusing a value of the config ("Invalid learning rate"): the same next time
            raise ConfigError([f"the model or its optimizer refused the config: {e}"], cfg.source) from e
        self.current_lr = 0.0  # the rate of the step just taken (train_step sets it)
        self.step_metrics: dict[str, torch.Tensor] = {}  # its objective's metrics (none for cross-entropy)

    def _build_runtime(self, found: Found | None) -> None:
        """What runs the steps once the weights are where the run starts: the attention kernel, the log, the saves,
        the (compiled, DDP) forward and the StepSetup every step of this attempt runs with, the reports."""
        cfg, t, dist = self.cfg, self.cfg.train, self.dist
        matmul = self.matmul = optimizer_step.matmul_dtype(t.dtype, self.device)  # bf16 autocast or fp32; MFU's peak
        recorded = found.state.get("kernels") if found else None  # a resume keeps the run's attention kernel
        self.kernels = attention_choice.settle(cfg, dist, matmul == "bf16", recorded)
        self.log = tensorboard.tee(self.log, cfg, self.step)  # [log] tensorboard: its lines also as scalars
        # Under a supervisor (minilmd/supervision.py) scratch is pruned by the supervisor, which knows what is
        # synced and what it is copying right now; the trainer neither prunes nor re-validates its checkpoints
        # (a read of every byte: 0.5 s per save of a 767 MB one). On its own it keeps the newest keep_local.
        keep = None if supervision() is not None else t.keep_local
        # made here with the directories above it only on its own: under a supervisor scratch is the claimed one, and
        # one gone since was removed (save.ScratchGone), never made again by path
        self.checkpointer = AsyncCheckpointer(cfg.checkpoint_dir, keep, tokenizer=self.corpus.tokenizer_files,
                                              state_of=adapter_state_dict if cfg.lora.enabled else None,
                                              parents=supervision() is None)
        self.loss_guard = LossGuard(self.device)
        self.saves = Saves(cfg, dist, self.checkpointer, self.log, self.loss_guard,
                           lambda: (self.model, self.optimizer, self.trainer_state()))
        self.autocast = optimizer_step.autocast_for(matmul, self.device)
        forward = wrap_ddp(TrainingForward(self.model, self.objective), dist)
        self.compiled = compile_enabled(t.compile, self.device)
        # Any: torch.compile is typed as returning a plain callable; it returns a module that passes attribute
        # lookups (DDP's no_sync) through to the one it wraps.
        compiled: Any = torch.compile(forward) if self.compiled else forward
        self.step_setup = optimizer_step.StepSetup(
            model=self.model, forward=compiled,
            optimizer=self.optimizer, dist=dist, autocast=self.autocast,
            dynamic_width=self.compiled and isinstance(self.sampler, BucketedSampler),
            micro_batch_size=t.micro_batch_size, grad_accum=t.grad_accum, global_batch=self.global_batch,
            grad_clip=t.grad_clip)
        self.reports = Reports(cfg, dist, self.log, self.early, self.saves, self.loss_guard, self.total_steps,
                               self.epoch_of, self.validate, self.probe_loss if self.probe_batches else None,
                               self.model, matmul)
        self.log.total_steps = self.total_steps  # every heartbeat says it: a restart's total before its first log

    def apply_resume(self, found: Found) -> None:
        """The one place a checkpoint's contents reach the run: the weights (a LoRA run's adapters, on the base
        they were trained on), the optimizer, then every part's own keys of its trainer_state.json."""
        load_model_state(self.model, found, self.cfg.lora.enabled, self.state.init_record)
        self.optimizer.load_state_dict(found.optimizer_state)
        for part in self.parts():
            part.load_state_dict(found.state)
        # a budget in tokens or epochs: what the checkpoint trained, then the rest at this attempt's batch
        self.total_steps = total_steps_for_budget(self.cfg, self.global_batch, self.rows_per_epoch,
                                                  self.state.trained())
        kept = keep_recorded_schedule(self.cfg, found.state.get("config"))  # the rates it started with
        self.stage_defaults = {k: v for k, v in self.stage_defaults.items() if k not in kept}  # not applied now
        changes = stream_changes(self.cfg, stream_record(found.state), world_size=self.dist.world_size,
                                 on_cuda=self.device.type == "cuda")  # another dtype,
        # seq_len, batch, seed, mode, or another number of ranks
        if self.dist.is_main:
            announce(found, self.step, self.global_batch)
            print("".join(f"minilmd: {line}\n" for line in kept.values()), end="", flush=True)
            if changes:
                print(f"minilmd: note: {change_note(self.step, changes)}", flush=True)

    def parts(self) -> list[Stateful]:
        """The parts whose state_dict fragments make up trainer_state.json, in the order a resume loads them."""
        return [self.rng, self.state, self.early, self.cursor]

    # --- the parts' state, as the loop and the tests name it ------------------------------------------------------
    @property
    def step(self) -> int:
        return self.state.step

    @step.setter
    def step(self, value: int) -> None:
        self.state.step = value

    @property
    def global_batch(self) -> int:
        return self.state.global_batch

    @property
    def sampler(self) -> Sampler:
        return self.cursor.sampler

    # --- components ---------------------------------------------------------------------------------------------
    def expectation(self) -> Expectation:
        return Expectation.for_corpus(self.cfg, self.corpus.meta)  # its model, corpus, LoRA: what it may resume

    def epoch_of(self, step: int) -> int:
        """The epoch optimizer step `step` starts in (its first row's pass over the train split)."""
        return self.cursor.epoch_of_row(self.first_row(step))

    def first_row(self, step: int) -> int:
        return self.state.first_row(step)

    def trainer_state(self) -> dict:
        """trainer_state.json: every part's fragment, and what describes the run (its config, corpus, world)."""
        out = {"epoch": self.epoch_of(self.step), "config": self.cfg.to_dict(),
               "fingerprints": {"data": self.corpus.data_fingerprint, "tokenizer": self.corpus.tokenizer_fingerprint},
               "world_size": self.dist.world_size, "global_batch": self.global_batch, "total_steps": self.total_steps,
               "kernels": self.kernels, MATMUL: self.matmul, CORPUS_SUMMARY: corpus_summary(self.corpus.meta)}
        for part in self.parts():
            out.update(part.state_dict())
        return out

    def save(self) -> None:
        """Checkpoint this step (trainer/loop/saving.py)."""
        self.saves.save(self.step)

    # --- one optimizer step (trainer/loop/step.py), with what it needs handed over ---------------------------------
    def to_device(self, batch: Batch) -> DeviceBatch:
        """The batch's ids, next-token labels and positions on the device (step.to_device)."""
        return optimizer_step.to_device(batch, self.device, self.step_setup.dynamic_width)

    def accumulate_gradients(self, step: int) -> tuple[torch.Tensor, int]:
        loss_sum, n_real, _ = optimizer_step.accumulate_gradients(self.step_setup, self.sampler, step,
                                                                  self.first_row(step))
        return loss_sum, n_real

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One optimizer step at this step's rate. Returns (this rank's part of the loss, grad norm, real tokens of
        the global batch)."""
        t = self.cfg.train
        self.current_lr = lr_at(self.step, self.total_steps, t.lr, t.min_lr_ratio, t.warmup_steps)
        result = optimizer_step.train_step(self.step_setup, self.sampler, self.step, self.first_row(self.step),
                                           self.current_lr)
        self.step_metrics = result.metrics  # the objective's, for the next train line
        return result.loss_sum, result.grad_norm, result.n_real

    def validate(self, batches: list | None = None) -> optimizer_step.Evaluation:
        """The objective over the fixed validation rows, or over `batches`: mean loss and metrics."""
        return optimizer_step.evaluate(self.objective, self.model, self.val_batches if batches is None else batches,
                                       self.device, self.autocast)

    def evaluate(self, batches: list | None = None) -> float:
        """Mean loss over every target of the fixed validation rows, or of `batches`."""
        return self.validate(batches).loss

    def probe_loss(self) -> float:
        """[eval] probe's next-token loss, whatever this run's objective (DPO's needs pairs and their reference): the
        forgetting of an earlier stage measured alike on every run."""
        return optimizer_step.evaluate(build_objective(self.cfg), self.model, self.probe_batches, self.device,
                                       self.autocast).loss

    # --- the loop -------------------------------------------------------------------------------------------------
    def train(self) -> int:
        t = self.cfg.train
        self.saves.begin(self.step)
        if self.dist.is_main:
            m = self.model
            said = start_lines(self.cfg, m.num_parameters(), sum(p.numel() for p in m.parameters() if p.requires_grad),
                               f"{self.device} x {self.dist.world_size}", (self.step, self.total_steps),
                               self.global_batch, self.corpus.data_format, self.stage_defaults)
            print("".join(f"minilmd: {line}\n" for line in said), end="", flush=True)
        self.log.heartbeat(self.step, force=True)
        # torch.compile compiles on the first call, and for a new shape
        widths = warmup.WidthWatch(self.sampler, self.compiled, t.micro_batch_size, self.global_batch)
        meter = Throughput(sync=torch.cuda.synchronize if self.device.type == "cuda" else None)
        self.model.train()
        first_compile = warmup.compiles_first(self.compiled, self.sampler, self.step, self.total_steps)
        with meter.apart("compile_s" if first_compile else None):  # bucketed: an OOM at the widest width now
            warmup.widest_micro_batch(self.step_setup, self.sampler, widths, self.log.heartbeat, self.step,
                                      self.total_steps)
        first_step = self.step
        while True:
            stop, save_due = self.stop.agreed(self.dist, self.saves.due(self.step))
            if self.step >= self.total_steps:
                if not self.saves.saved(self.step):
                    self.save()
                    self.reports.log_eval(self.step)
                elif self.dist.is_main and self.step == first_step:
                    # Resumed into a finished budget: no save comes whose prune would remove what a kill between
                    # the last save and its prune left.
                    self.checkpointer.prune()
                self.saves.finish(self.step, HEARTBEAT_EXITING)
                return EXIT_DONE
            if stop:
                if self.dist.is_main:
                    print(f"minilmd: {self.stop.why()}; saving at step {self.step}", flush=True)
                self.saves.finish(self.step)
                return self.stop.exit_status()  # 75, or 73 on a full run.dir: saved to scratch all the same
            if save_due:
                with meter.apart("checkpoint_s"):
                    self.save()
            self.faults.maybe_fire(self.step)
            compiling = widths.new_at(self.first_row(self.step))
            if compiling:  # the supervisor allows restart.compile_timeout for this step
                self.log.heartbeat(self.step, phase="compiling", force=True)
            with meter.apart("compile_s" if compiling else None):
                loss_sum, grad_norm, n_real = self.train_step()
            if self.step == first_step:  # what exists now lives all run: the collector need not scan it again
                gc.collect()
                gc.freeze()
            self.state.step += 1
            self.state.tokens_seen += n_real
            meter.add(n_real, timed=not compiling)
            self.loss_guard.check(self.step, loss_sum)
            self.log.heartbeat(self.step)  # at most once a second (and at once after the compiling step)
            if self.step % t.log_every == 0 or self.step == self.total_steps:
                self.reports.log_train(self.step, self.state.tokens_seen, self.current_lr, self.step_metrics,
                                       loss_sum, grad_norm, meter)
            due = self.reports.eval_due(self.step)
            with meter.apart("eval_s" if due else None):  # apart (and synced) only when it evaluates: no sync a step
                stop_early = due and self.reports.log_eval(self.step)
            if stop_early:
                self.reports.stop_early(self.step)
                return EXIT_DONE
