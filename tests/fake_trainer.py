"""A stand-in for `minilmd train` that honours the trainer <-> supervisor protocol in milliseconds, without torch.

    python tests/fake_trainer.py train CONFIG [--set SECTION.KEY=VALUE ...]

What it does like the real trainer: reads the run config (exit 2 if bad), opens the prepared corpus (exit 65 if it
has no meta.json) and reads its train/tokens.bin through an mmap every step (so truncating the staged file under it
gives a real SIGBUS), resumes from the newest checkpoint in scratch, writes the heartbeat ("STEP/TOTAL") every step and
metrics.jsonl lines, saves checkpoints that [D]'s strict validation accepts (right keys and shapes, finite, manifest
last, atomic rename, LATEST), saves and exits 75 on SIGTERM, exits 0 at the budget, honours MINILMD_FAULT
(oom, sigbus, sigkill, hang, exception; each once per run). Its "weights" are a hash chain over the tokens read at
each step: a run interrupted anywhere and resumed ends with the same value as an undisturbed one.

Environment: FAKE_STEP_S seconds per step (default 0.02); FAKE_HOLD=STEP:PATH holds the run after STEP steps until
PATH exists (with FAKE_HOLD_STOPS=1 a SIGTERM ends the hold too: the trainer then saves and exits 75, as a live one
does); FAKE_STOP_HOLD=before:PATH or after:PATH holds a stop's save before or after it until PATH exists;
FAKE_OOM_ABOVE_MB: exit with a CUDA OOM at start while train.micro_batch_size is above this (a GPU too small for
the micro-batch); FAKE_COMPILE_S: before its first step, a "STEP/TOTAL compiling" heartbeat and this many seconds
of silence (a cold torch.compile); FAKE_HOLD_RESUMED=PATH: a trainer that resumed from a checkpoint (step > 0) beats
"STEP/TOTAL compiling" before its first step until PATH exists (a restart's compile, held for a test to look at).
FAKE_REFERENCE=PATH: a trainer starting at step 0 beats "0/TOTAL reference DONE/PAIRS" (a DPO run's reference
pass, its pairs counting up) until PATH exists; a SIGTERM meanwhile ends it at
once with exit 75, nothing saved, as the real pass does (trainer/loop/dpo_reference.py). At the budget it writes a
"STEP exiting" heartbeat, like the real trainer, then exits 0 after FAKE_EXIT_LINGER_S seconds more of silence
(default 0: a slow teardown, e.g. NCCL's). FAKE_CHECKPOINTS=PATH: resume from and save to PATH instead of the
config's checkpoint directory (a trainer whose scratch moved under a bug: it ends done with none where the
supervisor looks). FAKE_RUN_DIR_FULL=1: as the real trainer on a full run.dir, its heartbeat and metrics writes that
find no room are dropped, and it saves at the next step boundary and exits 73 (FAKE_STOP_HOLD=after holds that exit
too); without it a full run.dir is an ENOSPC traceback (exit 1). FAKE_SIGNALS_TO=PATH: each stop signal taken
(SIGTERM, SIGINT) appended to PATH as a line of its name. FAKE_SCRATCH_FULL_ON=HOST: exit 74 at once,
fault.json kind scratch_full naming that host (another node's scratch full, its lock without room).
FAKE_CORRUPT_CACHE: the first time, leave a truncated kernel in its inductor cache dir (TORCHINDUCTOR_CACHE_DIR,
else torch's default under the temp dir), as a
kill in the middle of a compile does; every attempt that finds it there dies on it as torch does: "1" (or an
absolute path, where the file is put instead) 5 bytes and the InductorError `file too short` (exit 1); "sigbus" a
real shared object cut in half and SIGBUS (the loader maps a segment past the end of the file).
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from minilmd import fsio, names, perms, protocol
from minilmd.config import ConfigError, load_config
from minilmd.config_values import parse_duration
from minilmd.model_shapes import expected_adapter_shapes, expected_state_shapes
from minilmd.supervision import supervision

STOP = {"requested": False}
RUN_DIR = {"full": False}  # FAKE_RUN_DIR_FULL: a write into run.dir found no room


def _on_term(signum, frame):
    STOP["requested"] = True
    if noted := os.environ.get("FAKE_SIGNALS_TO"):
        with open(noted, "a") as out:
            out.write(f"{signal.Signals(signum).name}\n")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fingerprints(prepared: Path) -> dict:
    try:
        from minilmd.corpus.format import open_prepared

        corpus = open_prepared(prepared)
        return {"data": corpus.data_fingerprint, "tokenizer": corpus.tokenizer_fingerprint}
    except Exception:  # noqa: BLE001 - the supervisor then compares None with None
        return {"data": None, "tokenizer": None}


def shapes_of(cfg) -> dict:
    """The tensors a checkpoint of this config holds: a LoRA run's are its adapters alone, as the trainer saves."""
    return expected_adapter_shapes(cfg.model, cfg.lora) if cfg.lora.enabled else expected_state_shapes(cfg.model)


def save(root: Path, step: int, weights: int, cfg, prints: dict, keep: int) -> Path:
    from safetensors.numpy import save_file

    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    tmp.mkdir()
    tensors = {k: np.full(shape, (weights % 1000) / 1000.0, dtype=np.float32)
               for k, shape in shapes_of(cfg).items()}
    save_file(tensors, str(tmp / "model.safetensors"))
    save_file({}, str(tmp / "optimizer.safetensors"))
    for made in ("model.safetensors", "optimizer.safetensors"):  # born 0600: the run's policy, as the real trainer's
        perms.settle_new_file(tmp / made)
    (tmp / "optimizer.json").write_text(json.dumps({"param_groups": [], "scalars": {}}))
    state = {"step": step, "tokens_seen": step * cfg.train.seq_len, "config": cfg.to_dict(), "fingerprints": prints,
             "fake_weights": weights, "world_size": 1, "total_steps": cfg.train.max_steps,
             "rows_seen": step * cfg.train.micro_batch_size * cfg.train.grad_accum}  # as the trainer records
    (tmp / "trainer_state.json").write_text(json.dumps(state))
    files = {f.name: {"size": f.stat().st_size, "sha256": _sha256(f)} for f in sorted(tmp.iterdir())}
    manifest = {"format": "minilmd-checkpoint", "version": 1, "step": step, "files": files}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    os.rename(tmp, root / name)
    fsio.atomic_write_text(root / "LATEST", name + "\n")
    steps = sorted(p for p in root.iterdir() if p.name.startswith("step-") and (p / "manifest.json").is_file())
    for old in steps[:-keep]:
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    return root / name


def resume(root: Path) -> tuple[int, int]:
    if not root.is_dir():
        return 0, 0
    for p in sorted((p for p in root.iterdir() if p.name.startswith("step-")), reverse=True):
        try:
            state = json.loads((p / "trainer_state.json").read_text())
            if (p / "manifest.json").is_file():
                return state["step"], state["fake_weights"]
        except (OSError, ValueError, KeyError):
            continue
    return 0, 0


class Faults:
    def __init__(self, run_dir: Path):
        self.path = run_dir / names.FAULTS_FIRED
        self.wanted = {}
        for item in filter(None, os.environ.get(names.FAULT_ENV, "").split(",")):
            kind, _, step = item.partition("@")
            if kind not in protocol.FAULT_KINDS or not step.isdigit():
                raise ConfigError([f"{names.FAULT_ENV}: bad fault {item!r}"], names.FAULT_ENV)
            self.wanted[item] = (kind, int(step))

    def due(self, step: int) -> str | None:
        fired = set(self.path.read_text().split()) if self.path.exists() else set()
        for item, (kind, at) in self.wanted.items():
            if at == step and item not in fired:
                with open(self.path, "a") as f:
                    f.write(item + "\n")
                return kind
        return None


def corrupt_cache(run_dir: Path, how: str) -> str:
    """The last words of a trainer that loads a truncated kernel from its compile cache ("" if there is none; it
    dies of SIGBUS itself for "sigbus"). The first time (a marker in the run dir) it leaves one there."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or \
        os.path.join(tempfile.gettempdir(), f"torchinductor_{os.environ.get('USER', 'user')}")
    entry = Path(how) if how.startswith("/") else Path(root) / "q7" / "cq7fakekernel.main.so"
    marker = run_dir / "fake-cache-corrupted"
    if not marker.exists():
        marker.write_text(f"{entry}\n")
        entry.parent.mkdir(parents=True, exist_ok=True)
        if how == "sigbus":
            real = min(Path(np.__file__).parent.rglob("*.so"), key=lambda p: p.stat().st_size).read_bytes()
            entry.write_bytes(real[:len(real) // 2])
        else:
            entry.write_bytes(b"\x7fELF\x02")
    if not entry.is_file():
        return ""
    if how == "sigbus":
        os.kill(os.getpid(), signal.SIGBUS)
    return ("Traceback (most recent call last):\n  File \"torch/_inductor/codecache.py\", line 2466, in load\n"
            f"torch._inductor.exc.InductorError: ImportError: {entry}: file too short\n\n"
            "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this especially if you're reporting "
            "a bug to PyTorch). For even more developer context, set TORCH_LOGS=\"+dynamo\"")


def _hold(step: int, total: int, heartbeat) -> None:
    """FAKE_HOLD=STEP:PATH: once STEP steps are taken, wait (beating, as a live trainer does) until PATH exists, so
    that a test looks at a run that is surely still training, however loaded the machine."""
    at, _, release = os.environ.get("FAKE_HOLD", "").partition(":")
    stops = os.environ.get("FAKE_HOLD_STOPS") == "1"
    if at and step == int(at):
        while not os.path.exists(release) and not (stops and STOP["requested"]):
            _beat(heartbeat, f"{step}/{total}")
            time.sleep(0.05)


def _stop_hold(when: str) -> None:
    """FAKE_STOP_HOLD=WHEN:PATH: a stop's save held, WHEN "before" it (a save that takes long) or "after" it (a
    trainer slow to exit once saved), until PATH exists; PATH.holding is made when the hold begins, for a test to
    wait on (then a second stop signal finds the trainer there)."""
    at, _, release = os.environ.get("FAKE_STOP_HOLD", "").partition(":")
    if at != when:
        return
    Path(release + ".holding").touch()
    while not os.path.exists(release):
        time.sleep(0.05)


def _hold_resumed(step: int, total: int, heartbeat) -> None:
    """FAKE_HOLD_RESUMED=PATH: a resumed trainer (step > 0) compiling, until PATH exists, before it logs a step."""
    release = os.environ.get("FAKE_HOLD_RESUMED")
    while release and step > 0 and not os.path.exists(release):
        _beat(heartbeat, f"{step}/{total} compiling\n")
        time.sleep(0.05)


def _reference_pass(step: int, total: int, heartbeat) -> bool:
    """FAKE_REFERENCE=PATH: the reference pass, held until PATH exists; False when a stop ended it (nothing saved)."""
    release = os.environ.get("FAKE_REFERENCE")
    done = 0
    while release and step == 0 and not os.path.exists(release):
        if STOP["requested"]:
            print(f"stopped in the DPO reference pass at {done}/1000 pairs: nothing saved", flush=True)
            return False
        done = min(done + 1, 999)
        _beat(heartbeat, f"0/{total} {names.HEARTBEAT_REFERENCE} {done}/1000\n")
        time.sleep(0.05)
    return True


def _beat(heartbeat: Path, text: str) -> None:
    """The heartbeat replaced whole, as the real trainer does (minilmd/metrics.py): a reader never sees it
    empty halfway through a write (a status under load once read "no heartbeat step" there)."""
    tmp = heartbeat.with_name(f".{heartbeat.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, heartbeat)
    except OSError as e:
        if not _dropped_on_full(e):
            raise
        tmp.unlink(missing_ok=True)


def _write_metrics(metrics, line: str) -> None:
    """A metrics line; none once run.dir was found full (FAKE_RUN_DIR_FULL)."""
    if RUN_DIR["full"]:
        return
    try:
        metrics.write(line)
    except OSError as e:
        if not _dropped_on_full(e):
            raise


def _dropped_on_full(e: OSError) -> bool:
    """FAKE_RUN_DIR_FULL: a write into run.dir that found no room is dropped and asks the loop to stop (exit 73)."""
    if os.environ.get("FAKE_RUN_DIR_FULL") != "1" or not fsio.is_disk_full(e):
        return False
    RUN_DIR["full"] = True
    return True


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "train":
        print("usage: fake_trainer.py train CONFIG [--set K=V ...]", file=sys.stderr)
        return protocol.EXIT_CONFIG
    sets = [argv[i + 1] for i in range(2, len(argv) - 1) if argv[i] == "--set"]
    try:
        cfg = load_config(argv[1], sets)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return protocol.EXIT_CONFIG
    run_dir, ckpt_root = cfg.run_dir, Path(os.environ.get("FAKE_CHECKPOINTS") or cfg.checkpoint_dir)
    prepared = Path(cfg.data.prepared)
    if not (prepared / "meta.json").is_file():
        print(f"data error: {prepared} has no meta.json", file=sys.stderr)
        return protocol.EXIT_DATA
    if host := os.environ.get("FAKE_SCRATCH_FULL_ON"):  # another node's local rank 0 found no room for its lock
        protocol.write_fault(run_dir, protocol.FaultNote.SCRATCH_FULL, f"scratch full on {host}: no inode left",
                             path=str(cfg.scratch_dir), host=host)
        return protocol.EXIT_SCRATCH_FULL
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    step_s = float(os.environ.get("FAKE_STEP_S", "0.02"))
    oom_above = os.environ.get("FAKE_OOM_ABOVE_MB")
    mb, accum = cfg.train.micro_batch_size, cfg.train.grad_accum
    print(f"fake trainer pid {os.getpid()}: micro_batch_size {mb}, grad_accum {accum}", flush=True)
    print(f"fake trainer environment: CUBLAS_WORKSPACE_CONFIG={os.environ.get('CUBLAS_WORKSPACE_CONFIG')!r}",
          flush=True)  # train.deterministic's, from the supervisor's launch environment
    if (share := os.environ.get("FAKE_SHARE_GOES")) and os.path.isdir(share):  # its NFS share goes while it trains
        os.rename(share, f"{share}.gone")
    if oom_above and mb > int(oom_above):
        protocol.write_fault(run_dir, protocol.FaultNote.CUDA_OOM, f"CUDA out of memory at micro_batch_size {mb}",
                             step=0, micro_batch_size=mb)
        return protocol.EXIT_CUDA_OOM

    if os.environ.get("FAKE_CORRUPT_CACHE") and (crash := corrupt_cache(run_dir, os.environ["FAKE_CORRUPT_CACHE"])):
        print(crash, file=sys.stderr, flush=True)
        return protocol.EXIT_CRASH

    tokens_file = open(prepared / "train" / "tokens.bin", "rb")
    tokens = mmap.mmap(tokens_file.fileno(), 0, prot=mmap.PROT_READ)
    n_tokens = len(tokens) // 2
    prints = fingerprints(prepared)
    step, weights = resume(ckpt_root)
    print(f"resuming at step {step}", flush=True)
    every = cfg.train.checkpoint_every
    every_steps = every if isinstance(every, int) else None
    every_s = None if every_steps else parse_duration(every)
    last_save = time.monotonic()
    try:
        faults = Faults(run_dir)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return protocol.EXIT_CONFIG
    heartbeat = run_dir / names.HEARTBEAT
    metrics = open(run_dir / names.METRICS, "a", buffering=1)
    total = cfg.train.max_steps
    compile_s = float(os.environ.get("FAKE_COMPILE_S", "0"))
    if compile_s and step < total:
        _beat(heartbeat, f"{step}/{total} compiling\n")
        time.sleep(compile_s)
    _hold_resumed(step, total, heartbeat)
    if not _reference_pass(step, total, heartbeat):
        return protocol.EXIT_STOPPED
    while step < total:
        kind = faults.due(step + 1)
        if kind == "oom":
            protocol.write_fault(run_dir, protocol.FaultNote.CUDA_OOM, "injected CUDA OOM", step=step + 1,
                                 micro_batch_size=mb)
            return protocol.EXIT_CUDA_OOM
        if kind == "sigbus":
            os.kill(os.getpid(), signal.SIGBUS)
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            while True:
                time.sleep(1)
        if kind == "exception":
            raise RuntimeError(f"injected exception at step {step + 1}")
        _hold(step, total, heartbeat)
        t0 = time.monotonic()
        time.sleep(step_s)
        i = (step * 7919) % n_tokens
        token = int.from_bytes(tokens[2 * i:2 * i + 2], "little")  # a page fault: SIGBUS if the file shrank
        weights = (weights * 1000003 + token + 1) % (1 << 61)
        step += 1
        _beat(heartbeat, f"{step}/{total}")
        dt = time.monotonic() - t0
        if step % cfg.train.log_every == 0 or step == total:
            _write_metrics(metrics, json.dumps({"kind": "train", "step": step,
                                                "tokens_seen": step * cfg.train.seq_len * mb * accum,
                                                "loss": 10.0 / (1 + step), "lr": cfg.train.lr, "grad_norm": 1.0,
                                                "tok_s": cfg.train.seq_len * mb * accum / dt, "step_time": dt,
                                                "total_steps": total, "time": time.time(),
                                                "micro_batch_size": mb, "grad_accum": accum}) + "\n")
        due = (every_steps and step % every_steps == 0) or (every_s and time.monotonic() - last_save >= every_s)
        # read once: a SIGTERM between two reads saved, not stopped
        stopping = (STOP["requested"] or RUN_DIR["full"]) and step < total
        if stopping:
            _stop_hold("before")
        if stopping or due or step == total:
            # like the real trainer: under a supervisor (minilmd/supervision.py) the supervisor prunes scratch
            keep = sys.maxsize if supervision() is not None else cfg.train.keep_local
            path = save(ckpt_root, step, weights, cfg, prints, keep)
            last_save = time.monotonic()
            _write_metrics(metrics, json.dumps({"kind": "checkpoint", "step": step, "blocking_s": 0.0,
                                                "path": str(path), "time": time.time()}) + "\n")
        if stopping:
            _stop_hold("after")
            if RUN_DIR["full"]:  # its log is in run.dir: not a word
                return protocol.EXIT_RUN_DIR_FULL
            print(f"stopped at step {step}", flush=True)
            return protocol.EXIT_STOPPED
    print(f"done at step {step}: weights {weights}", flush=True)
    _beat(heartbeat, f"{step} {names.HEARTBEAT_EXITING}\n")  # training is over: what is left is teardown
    time.sleep(float(os.environ.get("FAKE_EXIT_LINGER_S", "0")))
    return protocol.EXIT_DONE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
