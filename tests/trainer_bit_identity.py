"""Tiny pretraining, SFT and LoRA runs of the real Trainer, in process on the CPU, reduced to sha256 digests of
their final weights and optimizer state (and the exact final validation loss): what a change to the Trainer's
structure must leave bit for bit as it was (tests/test_trainer_bit_identity.py).

`python tests/trainer_bit_identity.py --write` records the digests in tests/trainer_bit_identity.json (run it on
the code whose numbers are the reference: the fixture was first written by main before the Trainer was split into
parts); `python tests/trainer_bit_identity.py --out PATH` writes them to PATH (the trainer's own lines go to
stdout). The corpora are synthetic token ids from a
seeded numpy generator (no tokenizer training decides them), one thread, a fresh process: the digests depend only
on the code, the torch build and the CPU's kernels, which the fixture records beside them. MKL, which does the
matrix products, picks its code path by the CPU model, not by the capability torch reports: an AVX512 machine with
AMX (Sapphire Rapids) gave other digests than the AVX512 one the fixture was first written on, for main's code and
the code that wrote the fixture alike (measured 2026-12-05). So the script pins MKL's path (MKL_CBWR, its
Conditional Numerical Reproducibility, set before torch loads MKL), and the fixture is of that path.

The runs: packed pretraining (with validations, so early stop's state and the validation loss take part), the same
stopped at step 3 by a stop request and resumed by a new Trainer (the resume path), packed with data.doc_mask,
length-bucketed SFT on a chat corpus (the widest-batch warm-up and the SFT defaults; also resumed), SFT padded to
seq_len and padding-free (packed conversations, doc_mask), and LoRA with dropout on a saved base, straight through
and resumed (the RNG must come back).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

MKL_PATH = "AVX2"
"""The MKL code path the digests are of (MKL_CBWR): one every machine that runs torch's AVX2 or AVX512 kernels has."""
if __name__ == "__main__":  # only the script's own process: the test's worker keeps MKL's default path
    os.environ["MKL_CBWR"] = MKL_PATH

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from chat_synthetic import synthetic_chat_prepared  # noqa: E402
from minilmd.config import load_config  # noqa: E402
from minilmd.protocol import EXIT_DONE, EXIT_STOPPED  # noqa: E402
from minilmd.trainer.loop.guards import StopFlag  # noqa: E402
from minilmd.trainer.loop.train import Dist, Trainer  # noqa: E402
from trainer_corpus import write_config, write_prepared  # noqa: E402
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer  # noqa: E402

FIXTURE = HERE / "trainer_bit_identity.json"
VOCAB = 320
STEPS = 6
STOP_AT = 3
LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.1, "targets": ["q_proj", "v_proj", "gate_proj", "down_proj"]}


class StopAtStep(StopFlag):
    """A stop request that arrives once the trainer has taken `at` steps (as a SIGTERM would, between steps)."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at
        self.trainer: Trainer | None = None
        self.signal_name = "test stop"

    @property
    def requested(self) -> bool:  # type: ignore[override]
        return self.trainer is not None and self.trainer.step >= self.at


def text_corpus(root: Path, tokenizer: Path) -> tuple[Path, int]:
    rng = np.random.default_rng(7)
    docs = [rng.integers(3, VOCAB, int(n)).tolist() for n in rng.integers(5, 90, 260)]
    return write_prepared(root / "text", docs[20:], docs[:20], VOCAB, tokenizer), VOCAB


def digest_tensors(named: list[tuple[str, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for name, tensor in named:
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.dim() else t.reshape(1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def optimizer_digest(optimizer: torch.optim.Optimizer) -> str:
    state = optimizer.state_dict()
    named = [(f"{i}.{k}", v) for i, s in sorted(state["state"].items()) for k, v in sorted(s.items())]
    groups = [{k: v for k, v in g.items()} for g in state["param_groups"]]
    return digest_tensors(named) + ":" + hashlib.sha256(json.dumps(groups, sort_keys=True).encode()).hexdigest()


def summary(t: Trainer) -> dict:
    return {"step": t.step, "tokens_seen": t.trainer_state()["tokens_seen"],  # as main's Trainer and this one say
            "model": digest_tensors(sorted(t.model.state_dict().items())),
            "optimizer": optimizer_digest(t.optimizer), "val_loss": repr(t.evaluate())}


def cpu() -> Dist:
    return Dist(0, 1, 0, torch.device("cpu"))


def straight(config: Path) -> dict:
    t = Trainer(load_config(config), cpu())
    assert t.train() == EXIT_DONE
    return summary(t)


def stopped_and_resumed(config: Path) -> dict:
    stop = StopAtStep(STOP_AT)
    first = Trainer(load_config(config), cpu(), stop)
    stop.trainer = first
    assert first.train() == EXIT_STOPPED and first.step == STOP_AT
    del first
    second = Trainer(load_config(config), cpu())
    assert second.step == STOP_AT, "the second attempt did not resume"
    assert second.train() == EXIT_DONE
    return summary(second)


def all_runs(tmp: Path) -> dict[str, dict]:
    (tmp / "tok").mkdir()
    tokenizer = train_tokenizer(tmp / "tok" / "tokenizer.json", VOCAB)
    text = text_corpus(tmp, tokenizer)
    chat = synthetic_chat_prepared(tmp / "chat", tokenizer, VOCAB, n=96, mean_len=30.0, max_len=64), VOCAB
    base = save_checkpoint(tmp / "base" / "checkpoints", tiny_model(seed=5, vocab_size=VOCAB), step=2)
    train = {"max_steps": STEPS, "checkpoint_every": STOP_AT, "eval_every": 2}
    lora = {"init": {"from": str(base.parent)}, "lora": LORA, "train": {**train, "lr": 1e-2}}
    return {
        "pretrain": straight(write_config(tmp, text, name="pretrain", train=train)),
        "pretrain-resumed": stopped_and_resumed(write_config(tmp, text, name="pretrain-resumed", train=train)),
        "pretrain-doc_mask": straight(write_config(tmp, text, name="doc_mask", train=train,
                                                   data={"doc_mask": True})),
        "sft-bucketed": straight(write_config(tmp, chat, name="sft", train=train, data={"mode": "bucketed"})),
        "sft-padded": straight(write_config(tmp, chat, name="sft-padded", train=train, data={"mode": "padded"})),
        "sft-packed-doc_mask": straight(write_config(tmp, chat, name="sft-packed", train=train,
                                                     data={"mode": "packed", "doc_mask": True})),
        "sft-bucketed-resumed": stopped_and_resumed(write_config(tmp, chat, name="sft-resumed", train=train,
                                                                 data={"mode": "bucketed"})),
        "lora": straight(write_config(tmp, text, name="lora", **lora)),
        "lora-resumed": stopped_and_resumed(write_config(tmp, text, name="lora-resumed", **lora)),
    }


def where() -> dict:
    """What the digests depend on besides the code: the torch build, the CPU kernels it dispatches to, MKL's pinned
    path and the CPU's maker (MKL's paths are Intel's; another maker's CPU is not promised the same numbers)."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_cbwr": MKL_PATH, "cpu_vendor": _cpu_vendor()}


def _cpu_vendor() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("vendor_id")),
                "unknown")


def main(argv: list[str]) -> None:
    if os.environ.get("MKL_CBWR") != MKL_PATH:
        raise SystemExit(f"MKL_CBWR is {os.environ.get('MKL_CBWR')!r}, not {MKL_PATH!r}: run this file as a script")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        result = {"where": where(), "runs": all_runs(Path(tmp))}
    out = FIXTURE if argv == ["--write"] else Path(argv[1]) if len(argv) == 2 and argv[0] == "--out" else None
    if out is None:
        raise SystemExit("usage: trainer_bit_identity.py --write | --out PATH")
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
