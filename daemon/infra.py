"""The supervisor's calls that reach outside the process: NVML, the staging copy, the remote, pruning scratch and
launching the trainer, each in one small method, so that a test can replace one (a fake NVML, a fake process) by
subclassing `Infra`. The modules behind them are imported inside the methods. Torch-free.
"""
from __future__ import annotations

from pathlib import Path

from minilmd import protocol
from minilmd.config import RunConfig
from minilmd.daemon.child import process as childmod
from minilmd.daemon.child.process import Child


class Infra:
    """What the supervisor and its workers call; the real thing. Tests subclass it."""

    def open_gpu(self, cfg: RunConfig):
        """A GpuAdmission, or a sentence saying why there is no NVML."""
        from minilmd.daemon.host import gpu

        nvml = gpu.open_nvml_or_reason()
        if isinstance(nvml, str):
            return nvml
        return gpu.GpuAdmission(nvml, cfg.gpu, run_name=cfg.run.name)

    def open_nvml(self):
        """The bare NVML backend (Slurm's allocated cards are only checked, never leased), or why there is none."""
        from minilmd.daemon.host import gpu

        return gpu.open_nvml_or_reason()

    def stage(self, cfg: RunConfig, progress, log, from_copy=lambda why: None) -> Path:
        from minilmd.daemon.jobs import staging

        return staging.stage(cfg.data.prepared, cfg.scratch_dir, progress=progress, log=log, from_copy=from_copy)

    def final_staging_status(self, error: BaseException) -> int | None:
        """The supervisor's exit status when retrying cannot help: the source is not a usable prepared corpus (65),
        the corpus does not fit in scratch (2), or the checkpoint found on the remote belongs to another model (2)
        or to other data or another tokenizer (65: the trainer's own statuses for them). None for any other
        error."""
        from minilmd.checkpoint import CheckpointMismatch
        from minilmd.daemon.jobs.staging_errors import ScratchTooSmall, SourceInvalid
        from minilmd.scratch import ScratchRefused

        if isinstance(error, SourceInvalid):
            return protocol.EXIT_DATA
        if isinstance(error, CheckpointMismatch):
            return error.exit_status
        if isinstance(error, (ScratchTooSmall, ScratchRefused)):  # ScratchRefused: swapped
            return protocol.SUPERVISOR_CONFIG
        return None

    def verify_staged(self, path: Path) -> list[str]:
        from minilmd.daemon.jobs import staging

        return staging.verify_staged(path)

    def expectation(self, cfg: RunConfig, staged: Path):
        from minilmd.checkpoint import Expectation

        meta = None
        try:
            from minilmd.corpus.format import open_prepared

            meta = open_prepared(staged).meta
        except Exception:  # noqa: BLE001 - fingerprints are an extra check; the trainer refuses bad data itself
            pass
        return Expectation.for_corpus(cfg, meta)

    def syncer(self, cfg: RunConfig, expected, log):
        from minilmd.daemon.jobs import remote_claim, sync
        from minilmd.daemon.jobs.initstage import INIT_DIR

        base = cfg.scratch_dir / INIT_DIR if cfg.lora.enabled and cfg.init.from_ else None
        return sync.Syncer(cfg.checkpoint_dir, cfg.run.remote, expected, cfg.sync.keep, log=log, base=base,
                           claim=remote_claim.claim_of(cfg), run_dir=cfg.run_dir if cfg.run.dir else None)

    def prune_local(self, root: Path, keep: int, protect: list[Path], log) -> list[Path]:
        from minilmd.checkpoint_select import prune

        return prune(root, keep, protect=protect, log=log)

    def launch(self, command: list[str], run_dir: Path, attempt: int, devices: str,
               compile_cache: Path | None = None, extra_env: dict[str, str] | None = None) -> Child:
        return childmod.launch(command, run_dir, attempt, devices, extra_env=extra_env, compile_cache=compile_cache)
