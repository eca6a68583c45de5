"""The torch.compile caches are the run's own (inductor's and triton's, under scratch, kept across restarts) unless
the user set them; an attempt that dies on a truncated kernel in the run's own cache (left there by a trainer killed
while inductor compiled) has that entry removed and is retried without counting toward restart.no_progress_limit.
Nothing outside the run's own cache is ever deleted. The fake trainer plays torch: it dies with the InductorError
while the truncated file is there."""
from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from minilmd import compile_cache
from minilmd import scratch as scratch_module
from minilmd.config import RestartSection, load_config
from minilmd.daemon.base.states import Action, Cause
from minilmd.daemon.child import compilecache
from minilmd.daemon.child import process as childmod
from minilmd.daemon.child.death import Death
from minilmd.daemon.child.policy import decide
from minilmd.names import COMPILE_CACHE
from minilmd.protocol import SUPERVISOR_GAVE_UP
from supervisor_helpers import events, run_supervisor, state, write_config

PRINT_CACHES = [sys.executable, "-c", "import os; print('caches', os.environ['TORCHINDUCTOR_CACHE_DIR'], "
                                      "os.environ['TRITON_CACHE_DIR'])"]
CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def inductor_error(path: Path, why: str = "file too short") -> str:
    return (f"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            f"torch._inductor.exc.InductorError: ImportError: {path}: {why}\n\n"
            "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace\n")


def test_a_launched_trainer_gets_the_runs_own_caches_unless_the_user_set_them(tmp_path, monkeypatch):
    for var in CACHE_VARS:
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "scratch" / COMPILE_CACHE
    first = childmod.launch(PRINT_CACHES, tmp_path, 1, "", compile_cache=root)
    assert first.popen.wait(timeout=30) == 0
    log = first.log_path.read_text()
    assert f"\ncaches {root / 'inductor'} {root / 'triton'}\n" in log
    assert f"# TORCHINDUCTOR_CACHE_DIR={root / 'inductor'} (the run's own, under scratch)" in log

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    second = childmod.launch(PRINT_CACHES, tmp_path, 2, "", compile_cache=root)
    assert second.popen.wait(timeout=30) == 0
    log = second.log_path.read_text()
    assert f"\ncaches {tmp_path / 'mine'} {root / 'triton'}\n" in log
    assert f"# TORCHINDUCTOR_CACHE_DIR={tmp_path / 'mine'} (set for the supervisor, kept)" in log


def test_a_launched_trainer_writes_torch_compile_debug_output_in_its_run_directory_not_in_root(tmp_path,
                                                                                                 monkeypatch):
    """The trainer runs in "/" (minilmd/pychild.py): torch puts TORCH_COMPILE_DEBUG's output under the working
    directory unless TORCH_COMPILE_DEBUG_DIR says where. Unset, it is the run directory; set, the user's is kept."""
    show = [sys.executable, "-c", "import os; print('debug_dir', os.environ.get('TORCH_COMPILE_DEBUG_DIR'))"]
    monkeypatch.delenv("TORCH_COMPILE_DEBUG_DIR", raising=False)
    first = childmod.launch(show, tmp_path, 1, "")
    assert first.popen.wait(timeout=30) == 0
    assert f"\ndebug_dir {tmp_path.resolve()}\n" in first.log_path.read_text()
    monkeypatch.setenv("TORCH_COMPILE_DEBUG_DIR", str(tmp_path / "mine"))
    second = childmod.launch(show, tmp_path, 2, "")
    assert second.popen.wait(timeout=30) == 0
    assert f"\ndebug_dir {tmp_path / 'mine'}\n" in second.log_path.read_text()


def real_kernel() -> bytes:
    """A whole shared object as ld wrote it (numpy's smallest extension module) to cut short."""
    return min(Path(np.__file__).parent.rglob("*.so"), key=lambda p: p.stat().st_size).read_bytes()


def test_a_shared_object_cut_anywhere_is_damaged_and_a_whole_one_is_not(tmp_path):
    whole = real_kernel()
    path = tmp_path / "k.so"
    for size in (0, 5, 63, 64, 200, 1000, len(whole) // 2, len(whole) - 1):
        path.write_bytes(whole[:size])
        assert compilecache.damaged_elf(path), size
    path.write_bytes(b"\0" * len(whole))  # what a power loss leaves on some filesystems
    assert compilecache.damaged_elf(path)
    path.write_bytes(whole)
    assert not compilecache.damaged_elf(path)


def test_only_damaged_kernels_of_the_runs_own_cache_are_removed(tmp_path, monkeypatch):
    for var in CACHE_VARS:
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "scratch" / COMPILE_CACHE
    whole = real_kernel()
    named = root / "inductor" / "q7" / "cq7.main.so"
    cut = root / "triton" / "abc" / "__triton_launcher.so"
    healthy = root / "inductor" / "h1" / "ch1.so"
    for path, body in ((named, b"\x7fELF"), (cut, whole[:4096]), (healthy, whole)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    outside = tmp_path / "elsewhere.so"
    outside.write_bytes(b"\x7fELF")
    (root / "inductor" / "ln").symlink_to(tmp_path, target_is_directory=True)  # a link into elsewhere
    (root / "inductor" / "q7" / "link.so").symlink_to(outside)
    log = tmp_path / "attempt.log"
    said: list[dict] = []

    def cleared(text: str, sigbus: bool = False, environ=None) -> bool:
        log.write_text("# attempt 1: minilmd train run.toml\nresuming at step 0\n" + text)
        return compilecache.clear_damaged(log, root, os.environ if environ is None else environ, sigbus,
                                          lambda kind, message, **details: said.append(details))

    assert not cleared("RuntimeError: something else\n")  # a crash that is not the loader's: nothing looked at
    assert named.exists() and cut.exists()
    users = {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton")}
    assert not cleared(inductor_error(named), environ=users)  # the user's caches: never touched
    assert named.exists() and cut.exists()
    assert not cleared(inductor_error(outside))  # a file outside the run's own cache: never touched
    assert outside.exists()
    assert not cleared(inductor_error(root / "inductor" / ".." / ".." / ".." / "elsewhere.so"))  # climbs out
    assert not cleared(inductor_error(root / "inductor" / "ln" / "elsewhere.so"))  # through a link out of it
    assert not cleared(inductor_error(root / "inductor" / "q7" / "link.so"))  # a link in it, to elsewhere
    assert outside.exists() and named.exists() and cut.exists()
    (tmp_path / "alias").symlink_to(tmp_path / "scratch", target_is_directory=True)
    assert cleared(inductor_error(tmp_path / "alias" / COMPILE_CACHE / "inductor" / "q7" / "cq7.main.so"))
    assert sorted(said[-1]["paths"]) == sorted([str(named), str(cut)])
    named.write_bytes(b"\x7fELF")
    cut.write_bytes(whole[:4096])
    assert cleared(inductor_error(named))
    assert sorted(said[-1]["paths"]) == sorted([str(named), str(cut)])
    assert not named.exists() and not cut.exists() and healthy.exists() and outside.exists()
    assert (root / "inductor" / "q7" / "link.so").is_symlink() and (root / "inductor" / "ln").is_symlink()
    cut.write_bytes(whole[:4096])
    assert cleared("Fatal Python error: Bus error\n", sigbus=True) and not cut.exists() and healthy.exists()
    assert not cleared("Fatal Python error: Bus error\n", sigbus=True)  # nothing damaged left: a SIGBUS as any


def test_the_policy_retries_a_cleared_cache_without_counting_it_but_within_max_restarts():
    restart = RestartSection()
    death = Death(Cause.CRASH, 1, "torch._inductor.exc.InductorError: ImportError: /x.main.so: file too short")
    common = {"restart": restart, "stop_requested": False, "micro_batch_size": 4, "grad_accum": 1}
    retry = decide(death, restarts_so_far=3, no_progress_streak=restart.no_progress_limit, cache_cleared=True,
                   **common)
    assert retry.action == Action.RESTART and not retry.counts_as_restart
    assert decide(death, restarts_so_far=3, no_progress_streak=restart.no_progress_limit,
                  **common).action == Action.FAIL
    assert decide(death, restarts_so_far=restart.max_restarts, no_progress_streak=1, cache_cleared=True,
                  **common).action == Action.FAIL  # max_restarts still bounds a cache that keeps breaking


def cache_events(run_dir: Path) -> list[dict]:
    return [e for e in events(run_dir) if e["event"] == "compile_cache"]


@pytest.mark.slow
def test_an_attempt_that_dies_on_a_truncated_kernel_has_it_cleared_and_is_retried(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 10, "checkpoint_every": 5},
                          restart={"backoff_initial": "0.1s", "no_progress_limit": 1})
    cfg = load_config(config)
    # TMPDIR: where torch (and the fake) would put an inductor cache nobody set, kept inside the test
    env = {"FAKE_CORRUPT_CACHE": "1", "TMPDIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": "", "TRITON_CACHE_DIR": ""}
    assert run_supervisor(config, tmp_path, **env) == 0
    (cleared,) = cache_events(cfg.run_dir)
    (entry,) = map(Path, cleared["paths"])
    assert entry.is_relative_to(cfg.scratch_dir / COMPILE_CACHE / "inductor") and not entry.exists()
    assert [e["cause"] for e in events(cfg.run_dir) if e["event"] == "child_exit"] == ["crash", "done"]
    st = state(cfg.run_dir)
    assert st["phase"] == "done" and st["no_progress_streak"] == 0
    assert [r["cause"] for r in st["restarts"]] == ["crash"]


@pytest.mark.slow
def test_a_kernel_cut_mid_segment_kills_with_sigbus_and_is_cleared_too(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 10}, restart={"backoff_initial": "0.1s",
                                                                          "no_progress_limit": 1})
    cfg = load_config(config)
    env = {"FAKE_CORRUPT_CACHE": "sigbus", "TMPDIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": "",
           "TRITON_CACHE_DIR": ""}
    assert run_supervisor(config, tmp_path, **env) == 0
    (cleared,) = cache_events(cfg.run_dir)
    assert "SIGBUS" in cleared["message"]
    assert [e["cause"] for e in events(cfg.run_dir) if e["event"] == "child_exit"] == ["sigbus", "done"]
    assert state(cfg.run_dir)["no_progress_streak"] == 0


@pytest.mark.slow
def test_a_corrupt_entry_in_a_cache_the_user_set_is_never_deleted(tmp_path, corpus):
    config = write_config(tmp_path, corpus, train={"max_steps": 10},
                          restart={"backoff_initial": "0.1s", "no_progress_limit": 1})
    cfg = load_config(config)
    users = tmp_path / "users-cache"
    assert run_supervisor(config, tmp_path, FAKE_CORRUPT_CACHE="1", TORCHINDUCTOR_CACHE_DIR=str(users)) == \
        SUPERVISOR_GAVE_UP
    assert cache_events(cfg.run_dir) == []
    assert [p.name for p in users.rglob("*.so")] == ["cq7fakekernel.main.so"]


def test_a_value_the_user_set_is_kept_only_when_it_is_a_directory_of_his_alone(tmp_path):
    root = tmp_path / "scratch" / COMPILE_CACHE
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    users = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine" / "inductor"), "TRITON_CACHE_DIR": str(loose),
             "TMPDIR": "/tmp"}
    chosen = compile_cache.settle(root, users, "the supervisor", "the run's own")
    kept = chosen["TORCHINDUCTOR_CACHE_DIR"]
    assert (kept.value, kept.own, kept.refused) == (users["TORCHINDUCTOR_CACHE_DIR"], False, None)
    assert stat.S_IMODE(os.stat(kept.value).st_mode) == 0o700  # missing: made, his alone
    for var, sub, why in (("TRITON_CACHE_DIR", "triton", "mode 777"), ("TMPDIR", "tmp", "/tmp")):
        choice = chosen[var]
        assert choice.own and choice.value == str(root / sub) and os.path.isdir(choice.value), choice
        assert why in choice.refused and f"the {var} set for the supervisor is not used: " in choice.why, choice
    assert len(compile_cache.refusals(chosen)) == 2
    relative = compile_cache.choose(root, {"TMPDIR": "tmp"}, "x", "own")["TMPDIR"]
    assert relative.own and "not an absolute path" in relative.refused
    assert compile_cache.own_dirs(root, users) == [root / "triton"]  # the damaged-kernel scan: what the trainer used


def test_a_bench_compiles_in_a_private_directory_removed_after_and_its_environment_is_given_back(monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)  # this process's, given back after
    monkeypatch.setenv("TMPDIR", "/tmp")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/tmp")  # root's, anyone's to fill: not used
    with compile_cache.private_caches("bench x") as chosen:
        private = Path(chosen["TORCHINDUCTOR_CACHE_DIR"].value).parent
        assert private.name.startswith("minilmd-compile-cache-") and stat.S_IMODE(private.stat().st_mode) == 0o700
        assert os.environ["TRITON_CACHE_DIR"] == str(private / "triton")
        assert tempfile.gettempdir() == str(private / "tmp")
    assert not private.exists()
    assert os.environ["TRITON_CACHE_DIR"] == "/tmp" and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    assert tempfile.gettempdir() == "/tmp"


PRINT_SCRATCH = [sys.executable, "-c", "from minilmd import scratch; print('scratch', scratch.default_path('r'))"]


def test_a_slurm_jobs_trainer_finds_the_scratch_the_supervisor_claimed_though_its_tmpdir_moved(tmp_path, monkeypatch):
    """In a Slurm job the default scratch lies under TMPDIR (minilmd/scratch.py base). A TMPDIR others can write is
    not the trainer's (the compile caches' rule moves it under the run's own cache): before, the trainer found its
    scratch again under that cache, saved its checkpoints there, and the supervisor, seeing none, called the run done
    and removed the job's scratch with them. The base is pinned before TMPDIR moves."""
    shared_tmp = tmp_path / "node-tmp"
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)  # like /tmp: anyone's to write, so no TMPDIR for the compile caches
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    monkeypatch.delenv("MINILMD_SCRATCH_BASE", raising=False)
    claimed = scratch_module.default_path("r")
    assert claimed.parent.parent == shared_tmp  # the supervisor's: under the job's TMPDIR
    child = childmod.launch(PRINT_SCRATCH, tmp_path, 1, "", compile_cache=claimed / COMPILE_CACHE)
    assert child.popen.wait(timeout=60) == 0
    log = child.log_path.read_text()
    assert f"# TMPDIR={claimed / COMPILE_CACHE / 'tmp'} (" in log, log  # moved, as the rule says
    assert f"\nscratch {claimed}\n" in log, log  # and the trainer's scratch is the one the supervisor claimed


def test_the_standalone_trainer_keeps_its_claimed_scratch_once_its_compile_caches_are_set(tmp_path, monkeypatch):
    from trainer.loop.entry import own_compile_caches

    shared_tmp = tmp_path / "node-tmp"
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)
    for var in (*compile_cache.COMPILE_ENV, "MINILMD_SCRATCH_BASE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    cfg = load_config(write_config(tmp_path, (tmp_path / "corpus", 1000), run={"scratch": ""}))
    before = cfg.scratch_dir
    environ = dict(os.environ)  # own_compile_caches sets its variables in os.environ: given back whole after
    try:
        own_compile_caches(cfg)
        assert os.environ["TMPDIR"] == str(compile_cache.root_of(before) / "tmp")
        assert cfg.scratch_dir == before, (cfg.scratch_dir, before)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        tempfile.tempdir = None
