"""Every name minilmd gives a file, a directory or an environment variable: a run directory, scratch, a checkpoint
and a prepared corpus. Nothing else spells them; docs/formats.md describes what each file holds.

Checkpoint directories are named by pure functions (`step_name`, `step_of`), as in nanochat's checkpoint manager:
`step-00001234`, eight digits or more, so that names sort in step order. The names of what is in progress, each
saying which process made it, are minilmd/tmpnames.py's. Torch-free; at import, `os` and `re` only.
"""
from __future__ import annotations

import os
import re

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""What run.name may be, whole (fullmatch): it names files (the default scratch, a registry entry) and the systemd
unit. The config check (minilmd/config_values.py) and the registry's reader (daemon/host/registry.py) ask it."""

# --- The run directory (run.dir) ----------------------------------------------------------------------------------
RUN_CONFIG_COPY = "run.toml"  # the config as the supervisor started it; the trainer's --config
LOCK = "supervisor.lock"  # flock + {pid, host, since}: one supervisor per run directory
STATE = "state.json"  # the supervisor's view, rewritten atomically
COPY_CHUNK_BYTES = 8 << 20
"""The read size of every copy staging, a fetch and the sync make (corpus, init.from, checkpoints): big enough that
an NFS round trip per read costs little, small enough to hash as it goes without holding a file in memory."""
STATE_MAX_BYTES = 8 << 20
"""The largest state.json read (the supervisor's own, `status`, `ls`, a successor run's wait for it): a few KB,
so a bigger one is not one, and another user's (a link to /dev/zero) is never read far."""
EVENTS = "events.jsonl"  # one JSON line per supervisor event
SUPERVISOR_LOG = "supervisor.log"  # the same events, for humans
ATTEMPT_LOGS = "logs"  # logs/attempt-0001.log ... one per trainer launch
METRICS = "metrics.jsonl"  # one JSON line per logged step (and eval, and checkpoint save)
HEARTBEAT = "heartbeat"  # mtime refreshed about once a second of training; body "STEP[/TOTAL][ PHASE]"
HEARTBEAT_COMPILING = "compiling"  # the phase while the first torch.compile'd step runs: restart.compile_timeout
HEARTBEAT_REFERENCE = "reference"  # a DPO run's reference pass; body "STEP[/TOTAL] reference DONE/TOTAL/FROM/SECONDS"
HEARTBEAT_EXITING = "exiting"  # once training is over (final checkpoint saved): restart.exit_timeout; "STEP exiting"
HEARTBEAT_MAX_BYTES = 4096
"""The heartbeat is "STEP PHASE NOTE": more is not a heartbeat."""
FAULT = "fault.json"  # written by the trainer just before it exits on a failure it can see
FAULT_MAX_BYTES = 1 << 20
"""The largest fault.json read (a kind, a message, a few numbers)."""
FAULTS_FIRED = "faults-fired"  # injected faults (MINILMD_FAULT) that already fired in this run
TRAINER_RECORD = "trainer.json"  # the trainer launched last: pid, start ticks, uid, host, launch id (child/process.py)
TRAINER_RECORD_MAX_BYTES = 64 << 10
"""trainer.json is a few hundred bytes."""
TENSORBOARD_DIR = "tensorboard"  # TensorBoard event files of the trainer's scalars ([log] tensorboard = true)
RUN_DIR_RESERVE = ".space-reserve"  # a few zeros the supervisor gives up when run.dir is full, for its last words
STOP_REQUEST = "stop-request.json"  # `minilmd stop`'s request: a launcher's automatic restart exits 0 on it (not on
# an after_end one, left at a run's end for a start then under way: daemon/base/stoprequest.py)
STOP_REQUEST_MAX_BYTES = 4096  # a stop request is one small JSON object (who asked, when)
SCRATCH_ROOT_RECORD = "scratch-root.json"
"""{root, because, since}: the private root of the run's default scratch, where another user had taken the default
root's name (minilmd/scratch_root.py)."""
REMOTE_MADE = "remote-made.json"  # what the run's syncs made on a local remote: all they may remove there
KEPT_DIR = "unsynced"
"""run.dir's directory of a Slurm job's unsynced checkpoint (daemon/jobs/keptcopy.py)."""
KEPT_MADE = "unsynced.remote-made.json"
"""What the copies of a Slurm job's unsynced checkpoint made in `<run.dir>/unsynced/` (daemon/jobs/keptcopy.py): a
record of its own, since each sync's clean-up keeps only the entries naming what is on its own root."""
REMOTE_MADE_MAX_BYTES = 1 << 20
"""The largest record of what the syncs made read (daemon/jobs/remote_made.py)."""

_ATTEMPT_LOG = re.compile(r"attempt-([0-9]{4,})\.log")  # fullmatch: no newline after, ASCII digits only


def attempt_log_name(attempt: int) -> str:
    """`attempt-0001.log` for attempt 1: the trainer's stdout and stderr of one launch, under ATTEMPT_LOGS."""
    return f"attempt-{attempt:04d}.log"


def is_attempt_log(name: str) -> bool:
    return bool(_ATTEMPT_LOG.fullmatch(name))


TRAINER_LOCK = "trainer.lock"
"""In scratch: the exclusive flock of the one trainer that reads and writes its checkpoints (minilmd/trainer_lock.py),
holding who took it (pid, host, supervised or by hand)."""


# --- Environment variables -----------------------------------------------------------------------------------------
RUN_DIR_ENV = "MINILMD_RUN_DIR"
"""Set by the supervisor on every trainer it launches: the trainer runs supervised (it neither prunes scratch nor
reads the remote), and a restarted supervisor finds an orphaned trainer of its run by it in /proc."""
SUPERVISOR_PROCESS_ENV = "MINILMD_SUPERVISOR_PROCESS"
"""Set by the supervisor on every trainer it launches: "PID START_TICKS HOST" of the supervisor itself. A trainer
(each torchrun rank on that host) whose supervisor is gone stops as a SIGTERM stops it
(minilmd/supervisor_gone.py): nothing trains unsupervised, with nobody pruning its scratch."""
FAULT_ENV = "MINILMD_FAULT"
"""Fault injection for tests and the demo: "kind@step[,kind@step...]" (kinds: protocol.FAULT_KINDS)."""
CHECKPOINT_KILL_ENV = "MINILMD_TEST_CHECKPOINT_KILL"
"""Test-only: "point@step" makes the checkpoint writer SIGKILL itself at that point of the save protocol."""
HOLD_CORPUS_LOCK_ENV = "MINILMD_TEST_HOLD_CORPUS_LOCK"
"""Test-only: a FIFO that a corpus writer reads to its end once it holds the corpus lock and has opened what it
writes (minilmd/corpus/prepare/lock.py), so that a test can run a second writer while the first one holds it."""
TRAINER_CMD_ENV = "MINILMD_TRAINER_CMD"
"""Test-only: the command the supervisor launches instead of `python -m minilmd.cli train`."""
PRUNE_UNSYNCED_AFTER_ENV = "MINILMD_PRUNE_UNSYNCED_AFTER"
"""How long a failing remote is waited for before scratch is pruned without a sync (lower bound; a duration, 90 or
"90s" or "2m": default 60 s; read and checked by daemon/base/knobs.py)."""
SYNC_STALLED_AFTER_ENV = "MINILMD_SYNC_STALLED_AFTER"
"""How long a running sync runs before it shows as "stalled" in status (a duration: default 120 s;
daemon/base/knobs.py)."""
FINAL_SYNC_WAIT_ENV = "MINILMD_FINAL_SYNC_WAIT"
"""How long a Slurm job's last sync may wait for room or for run.remote's owner record before the job gives up on
it (a duration: default 15 min; daemon/base/knobs.py, daemon/slurm/lastsynccut.py)."""
LAUNCH_ID_ENV = "MINILMD_LAUNCH_ID"
"""Set by the supervisor on every trainer it launches: a random token, also in TRAINER_RECORD. Every process of
that trainer inherits it (torchrun's ranks too): with the uid, the host and the start time it tells the processes
this run started from any other process that carries MINILMD_RUN_DIR."""
SUPERVISOR_RUN_DIR_ENV = "MINILMD_SUPERVISOR_RUN_DIR"
"""In the environment `minilmd run` executes itself with (and its children inherit): the absolute run directory.
With SUPERVISOR_ID_ENV and the run lock it proves a process is that run's supervisor (minilmd/procs.py). Not
RUN_DIR_ENV: that one tells a trainer it runs supervised."""
SUPERVISOR_ID_ENV = "MINILMD_SUPERVISOR_ID"
"""In the environment `minilmd run` executes itself with: a random token, also in the run lock's body."""
SCRATCH_BASE_ENV = "MINILMD_SCRATCH_BASE"
"""Test-only: the directory that holds the per-user default scratch roots instead of /dev/shm."""
SYSTEM_REGISTRY_ENV = "MINILMD_SYSTEM_REGISTRY"
"""The machine-wide registry of runs instead of SYSTEM_REGISTRY (daemon/host/registry.py); for tests and odd layouts."""
SYSTEM_REGISTRY = "/var/lib/minilmd/runs"  # root:root 1777 when an admin made it: every user's runs, one file each
USER_REGISTRY = "minilmd/runs"  # under $XDG_STATE_HOME (~/.local/state): this user's runs, 0700
SLURM_JOB_ENV = "SLURM_JOB_ID"
"""Set by Slurm in a job: `minilmd run` then takes the allocation, a per-job node scratch, preemption as a requeue."""
SLURM_RESTART_COUNT_ENV = "SLURM_RESTART_COUNT"
"""Set by Slurm in a job: how often it was requeued before this start (0 or unset: the job as sbatch submitted it)."""
AUTO_RESTART_ENV = "MINILMD_AUTO_RESTART"
"""Set by a launcher only on the starts it makes by itself (deploy/minilmd-tmux.sh's window "run" after a supervisor
died: "tmux"): that `minilmd run` honours a stop request (STOP_REQUEST), as does a start the stop came after
(daemon/base/stoprequest.py); any other start clears one."""
SLURM_SRUN_ENV = "MINILMD_SLURM_SRUN"
""""1" (deploy/slurm/minilmd-multinode.sbatch sets it): launch each attempt as an srun step with one torchrun per
node even on one node, so that the multi-node script behaves the same whatever --nodes it is given."""
RDZV_SECRET_ENV = "MINILMD_RDZV_SECRET"
"""A multi-node attempt's rendezvous secret (random per attempt, in the environment only, never on a command line):
the minilmd-c10d store proves with it that the job's host node serves it (trainer/loop/rendezvous.py)."""
RDZV_BACKEND = "minilmd-c10d"
"""trainer/loop/rendezvous.py's torchrun rendezvous backend: the host node serves the store or fails, clients check
its proof (daemon/slurm/job.py names it on the command line)."""
RDZV_LAUNCHER = "minilmd.trainer.loop.rendezvous"
"""The module run as torchrun with RDZV_BACKEND (`python -m RDZV_LAUNCHER`): launched by daemon/slurm/job.py,
recognised as torchrun by daemon/child/process.py."""
TORCHRUN_GRACE_ENV = "MINILMD_TORCHRUN_GRACE_S"
"""Set by the supervisor on every trainer it launches: the run's save grace in whole seconds (restart.hang_timeout,
daemon/child/grace.py). On a stop signal the torchrun launchers (trainer/loop/torchrun.py) give their ranks that
long between the agent's SIGTERM and its SIGKILL, as the supervisor gives a single trainer, instead of torch's 30 s."""
TORCHRUN_LAUNCHER = "minilmd.trainer.loop.torchrun"
"""The module run as torchrun on one host (gpu.count > 1): torch.distributed.run with its stdout and stderr through
minilmd/terminal.py (its failure summary quotes a rank's error), exiting with its ranks' own status (73 for a run.dir
full, 75 for a stop) where torch's says 1; launched and recognised by daemon/child/process.py."""
CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
"""cuBLAS's workspace, fixed so that its reductions do not depend on what it finds (train.deterministic): read when
its first handle is made, so set before CUDA starts, in the supervisor's launch environment and at the trainer's
entry (trainer/loop/determinism.py)."""
CUBLAS_WORKSPACE_VALUES = (":4096:8", ":16:8")
"""The values torch accepts as deterministic; the first is set (the larger workspace, issue 41's measured one)."""


def determinism_env(deterministic: bool) -> dict[str, str]:
    """The environment a trainer of a run with `train.deterministic = deterministic` is launched with."""
    return {CUBLAS_WORKSPACE_ENV: CUBLAS_WORKSPACE_VALUES[0]} if deterministic else {}


# --- Scratch (run.scratch) ----------------------------------------------------------------------------------------
STAGED_CORPUS = "corpus"  # the staged, hash-verified copy of data.prepared
STAGED_CORPUS_SOURCE = "corpus.source"  # the data.prepared the staged copy was made from (minilmd/shared_place.py)
INIT_DIR = "init"
"""The staged copy of init.from: `<scratch>/init`; a LoRA run's durable copy of it too, `<remote>/init`."""
INIT_RECORD = "source.json"
"""In the staged copy of init.from (`<scratch>/init`, daemon/jobs/initstage.py): the source's fingerprint record."""
INIT_CHECKPOINT, INIT_PTH = "checkpoint", "weights.pth"
"""In the staged copy of init.from: the checkpoint directory, or the MiniMind .pth, copied."""
STAGED_RECORD_MAX_BYTES = 64 << 10
"""The largest record of what a staged copy was made from (STAGED_CORPUS_SOURCE: a path; init/source.json,
minilmd/init_source.py's STAGED_RECORD: a path, a hash and a few fields): a few hundred bytes when it is one."""
CHECKPOINTS = "checkpoints"  # the local checkpoint root
STAGING_TMP_PREFIX = ".tmp-corpus-"  # .tmp-corpus-<pid>: a staging in progress
STAGING_OLD_PREFIX = ".old-corpus-"  # .old-corpus-<pid>: a damaged staged copy whose good files are reused
COMPILE_CACHE = "compile-cache"  # inductor/ and triton/: the trainer's torch.compile caches, kept across restarts
SCRATCH_OWNER = "owner.json"  # {run_dir, run_name, uid, host}: the one run this scratch belongs to
OWNER_MAX_BYTES = 64 << 10
"""The largest owner.json read, in a scratch or on a remote (it names a run directory)."""
SCRATCH_BASE = "/dev/shm"  # where the per-user default scratch roots live


def default_scratch_root(uid: int, base: str = SCRATCH_BASE) -> str:
    """`/dev/shm/minilmd-<uid>`: one private (0700) directory per user, holding that user's default scratches."""
    return f"{base}/minilmd-{uid}"


def default_scratch(uid: int, run_name: str, base: str = SCRATCH_BASE) -> str:
    """`/dev/shm/minilmd-<uid>/<run.name>`: the default run.scratch."""
    return f"{default_scratch_root(uid, base)}/{run_name}"

# --- A checkpoint root (scratch/checkpoints, or the remote) and one checkpoint ----------------------------------
LATEST = "LATEST"  # the name of the newest checkpoint, for humans and scripts
BEST = "BEST"  # the checkpoint of the best validation by early_stop.metric; pruning and retention keep it
POINTER_MAX_BYTES = 4096
"""The largest LATEST or BEST read, local or on the remote: a checkpoint's name is some 15 bytes."""
QUARANTINE = "quarantine"  # quarantine/<name>-<time>/: damaged checkpoints set aside, never deleted (but a Slurm
# job's damaged kept copy in run.dir/unsynced/, by its own record: daemon/jobs/keptremote.py)
REASON_FILE = "reason.txt"  # in a quarantined checkpoint: why it was set aside
TMP_PREFIX = ".tmp-"  # every temporary directory in a checkpoint root
REMOTE_OWNER = "owner.json"
"""In run.remote's root: {run_dir, run_name, uid, host}, the one run whose sync writes (and prunes) there, as
SCRATCH_OWNER in a scratch (minilmd/run_owner.py; daemon/jobs/remote_claim.py writes it at the first sync)."""
REMOTE_MARK = ".minilmd-sync"  # in each directory a sync makes in a local remote's root: whose sync made it

MANIFEST = "manifest.json"  # size and sha256 of every other file; written last
MANIFEST_MAX_BYTES = 1 << 20
"""The largest manifest.json read by every reader (validation, the sync's remote scan and its size estimate,
init.from's fingerprint and staging, a base copy): a dozen entries of ~150 bytes, so 1 MiB is thousands of files.
One bound, so that a manifest one reader accepts no other refuses (init.from staged a copy that the trainer's
validation then refused, when staging read up to 16 MiB)."""
MODEL_FILE = "model.safetensors"
HF_CONFIG = "config.json"  # beside MODEL_FILE in an `export --format hf` directory (transformers' layout)
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_META = "optimizer.json"
TRAINER_STATE = "trainer_state.json"
TRAINER_STATE_MAX_BYTES = 4 << 20
"""The largest trainer_state.json read by every reader (validation, init.from, the update share of `run --check`,
the lineage `status` shows): the config, RNG states, corpus segments, 2-35 KB in real runs, so 4 MiB is a hundred
times that (at 64 MiB a padded one cost `verify` 77 s and 1.7 GB, in the depth scan and json.loads). Validation's
bound is every reader's, so that a checkpoint it accepts is read whole elsewhere too (at 16 MiB the update share and the
lineage skipped a valid checkpoint's)."""
DPO_REFERENCE = "dpo_reference.safetensors"
"""A DPO run's reference log-probability sums, in each of its checkpoints (trainer/loop/dpo_reference.py)."""
DPO_REFERENCE_PASS = "pass"
"""The tensor a stopped reference pass's file holds besides the sums: [pairs done, micro_batch_size]."""
REFERENCE_PASS = "dpo_reference_pass"
"""The manifest key of a step 0 saved by a stopped DPO reference pass: [pairs done, pairs in all] (absent: the sums
are complete). The sync replaces a remote step 0 whose pass is behind it (daemon/jobs/sync_pass.py)."""
DPO_REFERENCE_MAX_BYTES = 1 << 30
"""The largest reference file read: 4 bytes a document, so 134 million pairs, far more than any preference corpus."""
TOKENIZER_FILE = "tokenizer.json"  # a checkpoint's copy of the run's tokenizer, and the prepared corpus's own
PEFT_WEIGHTS = "adapter_model.safetensors"  # `export --format peft`: the adapters under PEFT's key names
PEFT_CONFIG = "adapter_config.json"  # `export --format peft`: PEFT's LoraConfig fields

_STEP_DIR = re.compile(r"step-([0-9]{8,})")  # fullmatch: "step-00000001\n" is another name; so is one of
# other scripts' digits, which int() would read as a step


def step_name(step: int) -> str:
    """`step-00001234` for step 1234."""
    return f"step-{step:08d}"


def step_of(name: str | os.PathLike) -> int:
    """The step in a checkpoint directory's name or path (`step-00001234` -> 1234); ValueError for other names."""
    base = os.path.basename(os.fspath(name).rstrip("/"))
    m = _STEP_DIR.fullmatch(base)
    if not m:
        raise ValueError(f"{name}: not a checkpoint directory name (expected step-XXXXXXXX)")
    return int(m.group(1))


def is_step_name(name: str) -> bool:
    """True for a checkpoint directory's name (`step-` and eight digits or more)."""
    return bool(_STEP_DIR.fullmatch(name))


def step_or_none(name: str | None) -> int | None:
    """step_of(name), or None for None, "" or any name that is not a checkpoint directory's."""
    return int(m.group(1)) if name and (m := _STEP_DIR.fullmatch(name)) else None


def leading_step(name: str) -> int | None:
    """The step of a name that begins with a step directory's name and a `-` (a quarantined step's, quarantine_name;
    a sync's copy once TMP_PREFIX is taken off, sync_tmp_name); None for any other."""
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m and name[m.end():m.end() + 1] == "-" else None


def kept_name(name: str, tag: str, token: str) -> str:
    """`init.kept-<host>-<pid>-<ticks>-boot<tag>-<token>` beside a remote's `init` (tag: pointer_tmp_tag's): what stood
    there, which a push moved out to look at and could neither put back nor move into quarantine/ (another user's
    entry or a link there). Neither a temporary name (TMP_PREFIX) nor a step name: no clean-up, retention or
    Remote.make_tmp ever removes it; it may be the only copy of a base older checkpoints were trained on."""
    return f"{name}.kept-{tag}{token}"


def quarantine_name(name: str, stamp: str, n: int = 1) -> str:
    """`step-00001234-20250101T120000` under QUARANTINE; `-2`, `-3` ... when that name is taken."""
    return f"{name}-{stamp}" if n == 1 else f"{name}-{stamp}-{n}"


# --- A prepared corpus (the output of `minilmd prepare`) --------------------------------------------------------
CORPUS_META = "meta.json"  # format, counts, and size + sha256 of every other file
CORPUS_META_MAX_BYTES = 4 << 20
"""The largest meta.json read (the corpus's readers, staging, prepare's --force and --append checks): a few KB of
counts, its file table, an entry per source and per version (`prepare --append`: thousands of them fit); a corpus
from elsewhere (another user's, on NFS) may be a link to /dev/zero, or padded (at 64 MiB one cost `corpus report`
226 s and 2.4 GB)."""
CORPUS_TOKENIZER = TOKENIZER_FILE  # the tokenizer the ids came from
SPLITS = ("train", "val")
TOKENS = "tokens.bin"  # in each split: uint16 little-endian ids, [BOS] doc [EOS] ...
DOC_LENGTHS = "doc_lengths.npy"  # in each split: the length of each document, BOS and EOS included
LOSS_MASK = "loss_mask.bin"  # in each split of a chat corpus: uint8, 1 on the target tokens, one per token
TOKENIZER_CONFIG = "tokenizer_config.json"  # beside a chat corpus's (and a checkpoint's) tokenizer.json: the chat
# template it was rendered with, and the special token names a template sees
TOKENIZER_MAX_BYTES = 16 << 20
"""The largest tokenizer.json loaded: MiniMind's is 441 KiB, a 150k-word vocabulary's (Qwen, Llama 3) 7-9 MiB; a
padded one of 64 MiB took `tokenizer check` 38 s before its refusal at 256 MiB."""
TOKENIZER_CONFIG_MAX_BYTES = 4 << 20
"""The largest tokenizer_config.json or chat template read (a tokenizer from elsewhere may be a huge file). Here,
beside the names, so that checkpoint validation (the supervisor imports it) needs no tokenizer machinery."""
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # a tokenizer directory's template in a file of its own (transformers)
UNCHECKED_VAL_TOKENS = "tokens.unchecked"  # prepare's val stream before the leak check; never in a finished corpus
UNCHECKED_VAL_MASK = "loss_mask.unchecked"  # the same for a chat corpus's val loss mask
LEAK_KEYS = "leak-keys.u64"  # prepare's train leak keys, streamed to disk; never in a finished corpus
LONG_DOCUMENT_SPOOL = "long-document.u16"  # prepare's ids of a long line until its end; never in a finished corpus


def split_file(split: str, name: str) -> str:
    """The corpus-relative name of a split's file, as meta.json lists it: `train/tokens.bin`."""
    return f"{split}/{name}"


def prepare_kept_prefix(out_name: str) -> str:
    """`<out>.kept-by-prepare`, before make_temp's random suffix: what stood at --out and changed while prepare ran,
    left whole beside it for its user (never a temporary name: no clean-up takes it)."""
    return f"{out_name}.kept-by-prepare"


