"""The part of a multi-node Slurm attempt that runs on each node before its torchrun: make this node's scratch the
run's and stage the corpus into it, then become the torchrun.

`srun` starts one of these per node (daemon/slurm/job.py `launch_command`):

    python -m minilmd.daemon.slurm.node --scratch S --source SRC --run-dir D --run-name N [--default] -- COMMAND...

The supervisor staged the corpus on its own node already (it is reused there after a check); every other node
copies it from `data.prepared` (a path every node sees, or an fsspec URL), with the same ownership rules for its
scratch as on one server (minilmd/scratch.py). Only rank 0 reads a checkpoint: the others receive it from rank 0
(trainer/loop/multinode.py), so a node's scratch never needs one. Exit 65 (data) or 2 (scratch refused) when the
corpus or the scratch cannot be used, which the supervisor classifies as it would the trainer's own. Torch-free.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from minilmd import compile_cache, protocol, scratch, terminal


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print("minilmd.daemon.slurm.node: no command after --", file=sys.stderr)
        return protocol.EXIT_CONFIG
    split = args.index("--")
    parser = argparse.ArgumentParser(prog="python -m minilmd.daemon.slurm.node")
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--run-name", required=True)
    parser.add_argument("--default", action="store_true", help="the scratch is the default (per-user root)")
    opts = parser.parse_args(args[:split])
    command = args[split + 1:]
    if not command:
        print("minilmd.daemon.slurm.node: no command after --", file=sys.stderr)
        return protocol.EXIT_CONFIG
    where = Path(opts.scratch)
    host = os.uname().nodename
    try:
        scratch.claim(where, Path(opts.run_dir), opts.run_name, opts.default)
    except (scratch.ScratchRefused, OSError) as e:
        print(f"minilmd node {host}: scratch {where}: {e}", file=sys.stderr, flush=True)
        return protocol.EXIT_CONFIG
    from minilmd.daemon.jobs import staging

    try:
        staged = staging.stage(opts.source, where, log=lambda msg: print(f"minilmd node {host}: {msg}", flush=True))
    except staging.SourceInvalid as e:
        print(f"minilmd node {host}: {e}", file=sys.stderr, flush=True)
        return protocol.EXIT_DATA
    except scratch.ScratchRefused as e:  # the scratch changed since the claim above (staging checks before removing)
        print(f"minilmd node {host}: scratch {where}: {e}", file=sys.stderr, flush=True)
        return protocol.EXIT_CONFIG
    except (staging.StagingError, OSError) as e:
        print(f"minilmd node {host}: staging failed: {e}", file=sys.stderr, flush=True)
        return protocol.EXIT_CRASH
    try:  # the caches the supervisor chose on its node, judged and made on this one (TMPDIR must exist to be used)
        compile_cache.apply(compile_cache.settle(compile_cache.root_of(where), os.environ, "the supervisor",
                                                 "the run's own, under scratch"))
    except OSError as e:
        print(f"minilmd node {host}: scratch {where}: the compile caches: {e}", file=sys.stderr, flush=True)
        return protocol.EXIT_CONFIG
    print(f"minilmd node {host}: corpus at {staged}; starting {command[0]}", flush=True)
    os.execvp(command[0], command)
    return protocol.EXIT_CRASH  # not reached: execvp raises or replaces this process


if __name__ == "__main__":
    terminal.escape_std_streams()  # its messages name the corpus and scratch paths: printable, as the CLI's
    sys.exit(main())
