"""What a resume's load of a checkpoint costs in host memory and time, side by side in one run: a real checkpoint of
a 123M-parameter model (hidden 768 x 16 layers, vocab 6400: MiniMind's) with its AdamW state, saved once on disk
(its page cache warmed before each run), resumed on the CPU by one rank, each variant in a fresh subprocess:
- `mmap`: the load before ef0bd47 (bb134fe's save.load): safetensors' load_file by path, which maps the file (page
  cache, shared between the ranks of a node; its pages become the process's own where the optimizer writes them);
- `bytes`: ef0bd47's (checkpoint.for_loading then): every file read whole into bytes while hashed, model and optimizer
  held at once, then safetensors.torch.load(bytes) making tensors from them (another copy);
- `now`: this tree's save.load_carrying (what a rank other than 0 does);
- `twice` and `once`, a resume's rank 0 with the validation before its load (`--variants twice,once`): `twice` as it
  was before validated_for_loading, find_latest (every file read, hashed and scanned) then save.load_carrying (every
  file read and hashed again); `once` as trainer/loop/resume.py does now, find_latest's walk validating with
  checkpoint_load.validated_for_loading (each file read once, hashed, scanned, and loaded from those bytes). Their `load
  s` is the validation and the load.
A resume here is the load, then what a trainer does with it (Trainer.apply_resume): the weights into its model, the
state into its AdamW, the load's result dropped, then one optimizer step. Per variant, the median of `--repeats`: the
load's wall time and the resume's, and the resume's peak host memory above the process's before it (model, AdamW and
gradients built): peak RSS (VmHWM: anonymous and file-backed pages; ru_maxrss would do, but it is inherited across
exec from the parent that saved the checkpoint) and the peak of RssAnon sampled every 2 ms (what the kernel cannot
drop or share: what an OOM kill weighs). Ratios are to the first variant of `--variants` (default mmap,bytes,now).
`.venv/bin/python scripts/resume_load_cost.py [--repeats N] [--dir DIR] [--hidden H --layers L] [--variants V,V]`
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import threading
import time
from pathlib import Path

from minilmd import pychild

VARIANTS = ("mmap", "bytes", "now", "twice", "once")


def save_step_one(root: Path, hidden: int, layers: int):
    """(the run's config, the checkpoint's directory, the model's parameters): step 1 of a real model and its AdamW
    state (scripts/scratch_start_cost.py times its start on the same)."""
    import torch

    from minilmd.config import RunConfig
    from minilmd.trainer.checkpoint import save as ckpt_io
    from minilmd.trainer.model.minimind import MiniMindForCausalLM

    cfg = RunConfig()
    cfg.model.hidden_size, cfg.model.num_hidden_layers = hidden, layers
    torch.manual_seed(0)
    model = MiniMindForCausalLM(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    state = {"step": 1, "tokens_seen": 0, "epoch": 0, "config": cfg.to_dict(), "rng": ckpt_io.capture_rng(),
             "fingerprints": {"data": None, "tokenizer": None}}
    return cfg, ckpt_io.save(root, 1, model.state_dict(), opt.state_dict(), state), model.num_parameters()


def _load_mmap(path: Path) -> tuple:
    """bb134fe's save.load, as it was: the tensors' files by path (load_file maps them)."""
    from safetensors.torch import load_file

    from minilmd.checkpoint import read_manifest
    from minilmd.names import MODEL_FILE, OPTIMIZER_FILE, OPTIMIZER_META, TRAINER_STATE

    read_manifest(path)
    model_state = load_file(path / MODEL_FILE)
    meta = json.loads((path / OPTIMIZER_META).read_text(encoding="utf-8"))
    optimizer = load_file(path / OPTIMIZER_FILE)
    json.loads((path / TRAINER_STATE).read_text(encoding="utf-8"))
    return model_state, optimizer, meta


def _load_bytes(path: Path) -> tuple:
    """ef0bd47's for_loading and load_carrying, their reading as it was: each file hashed into a BytesIO
    (checkpoint.hashed_bytes), all held, then safetensors.torch.load of the model's and the optimizer's bytes."""
    from safetensors.torch import load

    from minilmd.checkpoint import MAX_JSON_PART, read_manifest
    from minilmd.names import MODEL_FILE, OPTIMIZER_FILE, OPTIMIZER_META, TRAINER_STATE
    from minilmd.untrusted import Hashing, copy_regular, loads

    files = read_manifest(path)["files"]
    parts = {}
    for name, most in ((MODEL_FILE, None), (OPTIMIZER_FILE, None), (TRAINER_STATE, MAX_JSON_PART),
                       (OPTIMIZER_META, MAX_JSON_PART)):
        kept = io.BytesIO()
        sink = Hashing(keep=kept)
        size = files[name]["size"]
        copy_regular(path / name, sink, size=size, max_bytes=size if most is None else most)
        assert sink.sha256.hexdigest() == files[name]["sha256"]
        parts[name] = kept.getvalue()
    meta = loads(parts[OPTIMIZER_META], expect=dict)
    return load(parts[MODEL_FILE]), load(parts[OPTIMIZER_FILE]), meta


def _load_now(path: Path) -> tuple:
    from minilmd.trainer.checkpoint import save as ckpt_io

    return ckpt_io.load_carrying(path, {})


def _load_twice(path: Path) -> tuple:
    """A resume's rank 0 before validated_for_loading: find_latest validated, then the load read it all again."""
    from minilmd.checkpoint_select import find_latest
    from minilmd.trainer.checkpoint import save as ckpt_io
    from minilmd.trainer.loop.resume import CARRIED

    assert find_latest([path.parent], None, log=print, set_aside=False) == path
    return ckpt_io.load_carrying(path, CARRIED)


def _load_once(path: Path) -> tuple:
    """A resume's rank 0 now (trainer/loop/resume.py): the validation's one read is what is loaded."""
    from minilmd.checkpoint_load import validated_for_loading
    from minilmd.checkpoint_select import first_valid
    from minilmd.trainer.checkpoint import save as ckpt_io
    from minilmd.trainer.loop.resume import CARRIED

    taken = first_valid([path.parent], lambda p: validated_for_loading(p, None, CARRIED), log=print, set_aside=False)
    assert taken is not None and taken[0] == path
    return ckpt_io.loaded(taken[1])


def _status(field: str) -> int:
    """A field of /proc/self/status in bytes: VmHWM (this process's peak RSS; unlike ru_maxrss, not inherited across
    exec from the parent that started it), RssAnon (its anonymous pages now)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def _trainer(hidden: int, layers: int):
    """(model, AdamW) as a trainer has them when it resumes: built, the optimizer without state yet."""
    import torch

    from minilmd.config import RunConfig
    from minilmd.trainer.model.minimind import MiniMindForCausalLM

    cfg = RunConfig()
    cfg.model.hidden_size, cfg.model.num_hidden_layers = hidden, layers
    model = MiniMindForCausalLM(cfg.model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def one(variant: str, path: Path, hidden: int, layers: int) -> dict:
    """One resume in this (fresh) process: {load_s, resume_s, hwm, anon}. The resume is what a trainer does with the
    load: the weights into its model, the state into its optimizer, the load's result dropped, then one optimizer
    step (zero gradients: it writes every state tensor, as training does; a mapped file's pages become the process's
    own there). hwm and anon: the peaks over the resume, in bytes above the process's before it (model and optimizer
    built, gradients allocated)."""
    import safetensors.torch  # noqa: F401  (imported before the count starts, as a trainer has)
    import torch

    from minilmd.trainer.checkpoint import save as ckpt_io

    load = {"mmap": _load_mmap, "bytes": _load_bytes, "now": _load_now, "twice": _load_twice,
            "once": _load_once}[variant]
    model, opt = _trainer(hidden, layers)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    base_anon, peak, done = _status("RssAnon"), [0], threading.Event()
    base_hwm = _status("VmHWM")

    def sample() -> None:
        while not done.wait(0.002):
            peak[0] = max(peak[0], _status("RssAnon"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    loaded = load(path)
    load_s = time.perf_counter() - t0
    model.load_state_dict(loaded[0], strict=True)
    opt.load_state_dict(ckpt_io.optimizer_state_of(*loaded[1:]) if variant in ("mmap", "bytes") else loaded[1])
    del loaded
    opt.step()
    resume_s = time.perf_counter() - t0
    done.set()
    sampler.join()
    peak[0] = max(peak[0], _status("RssAnon"))
    return {"load_s": load_s, "resume_s": resume_s, "hwm": _status("VmHWM") - base_hwm, "anon": peak[0] - base_anon}


def _warm(path: Path, names) -> None:
    """Every file read once, so that each variant finds the page cache as a restart on the same node does."""
    for name in names:
        with open(path / name, "rb") as src:
            while src.read(64 << 20):
                pass


def measure(work: Path, hidden: int, layers: int, repeats: int, variants: tuple[str, ...] = VARIANTS[:3]) -> None:
    _, path, params = save_step_one(work / "checkpoints", hidden, layers)
    sizes = {f.name: f.stat().st_size for f in path.iterdir()}
    total = sizes["model.safetensors"] + sizes["optimizer.safetensors"]
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(repeats):
        for variant in variants:  # interleaved: a load of the machine weighs on every variant alike
            _warm(path, sizes)
            argv = pychild.python_argv(str(Path(__file__).resolve()), "--one", variant, str(path),
                                       "--hidden", str(hidden), "--layers", str(layers))
            out = pychild.run(argv, check=True, capture_output=True, text=True).stdout
            runs[variant].append(json.loads(out.splitlines()[-1]))
    med = statistics.median
    print(f"{params:,} parameters; model {sizes['model.safetensors'] / 1e6:,.0f} MB + optimizer "
          f"{sizes['optimizer.safetensors'] / 1e6:,.0f} MB = {total / 1e6:,.0f} MB (T) in {path}; median of {repeats}")
    keys = ("load_s", "resume_s", "hwm", "anon")
    first = variants[0]
    ref = {k: med(r[k] for r in runs[first]) for k in keys}
    print(f"  {'load':<7}{'load s':>8}{'resume s':>10}{'peak RSS MB':>13}{'x T':>6}{'peak anon MB':>14}{'x T':>6}"
          f"{'load s/' + first:>15}{'resume s/' + first:>16}{'RSS/' + first:>11}{'anon/' + first:>12}")
    for variant, rs in runs.items():
        m = {k: med(r[k] for r in rs) for k in keys}
        print(f"  {variant:<7}{m['load_s']:8.2f}{m['resume_s']:10.2f}{m['hwm'] / 1e6:13,.0f}{m['hwm'] / total:6.2f}"
              f"{m['anon'] / 1e6:14,.0f}{m['anon'] / total:6.2f}{m['load_s'] / ref['load_s']:15.2f}"
              f"{m['resume_s'] / ref['resume_s']:16.2f}{m['hwm'] / max(ref['hwm'], 1):11.2f}"
              f"{m['anon'] / max(ref['anon'], 1):12.2f}", flush=True)


def main() -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="where a new directory of the bench's own is made (on disk: a checkpoint's place)")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--variants", default=",".join(VARIANTS[:3]),
                        help=f"which loads, comma-separated, the ratios to the first: of {', '.join(VARIANTS)}")
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], Path(args.one[1]), args.hidden, args.layers)))
        return 0
    work = Path(tempfile.mkdtemp(prefix="minilmd-load-cost-", dir=args.dir))  # new, 0700: the bench's own
    try:
        variants = tuple(args.variants.split(","))
        if not variants or not set(variants) <= set(VARIANTS):
            parser.error(f"--variants: of {', '.join(VARIANTS)}")
        measure(work, args.hidden, args.layers, args.repeats, variants)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # made above: nothing else
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
