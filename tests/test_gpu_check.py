"""scripts/gpu-check --dry-run: every part of the device check runs on the CPU with a tiny model and CUDA faked, so
the script never rots between the runs on a GPU and no name it calls fails for the first time on one. Each part's
GPU branch reached (the branches it reports), the table and summary.json written when a part fails or its process
dies, and part 5 for real: a supervised run SIGKILLed at step 8, resumed, done, its weights bit-exact against an
undisturbed run. The MiniMind side by sides over a stand-in trainer are tests/test_gpu_check_minimind.py's."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SCRIPT = SCRIPTS / "gpu-check"


def gpu_check(tmp_path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--work", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    rows = {r["part"]: r for r in json.loads((tmp_path / "summary.json").read_text())}
    return done, rows


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> SimpleNamespace:
    """The dry run of every part under a --budget (each part runs with its share, MINILMD_GPU_CHECK_PART_S), once
    for the tests that read it: a part runs in a process of its own whatever ran before it, so its row here is the
    row an `--only` run of it gives. (done, rows, work): the process, summary.json's rows by part, the directory.
    The tests that read it (test_the_dry_run_*) run on one pytest-xdist worker (conftest.SAME_WORKER): each worker
    that ran one would run the whole dry run again, minutes of CPU."""
    work = tmp_path_factory.mktemp("gpu-check-dry-run")
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--work", str(work), "--budget", "1800"],
                          capture_output=True, text=True, timeout=1900)
    rows = {r["part"]: r for r in json.loads((work / "summary.json").read_text())}
    return SimpleNamespace(done=done, rows=rows, work=work)


@pytest.mark.slow
def test_the_dry_run_takes_each_parts_gpu_branch_with_cuda_faked(dry_run):
    done, rows = dry_run.done, dry_run.rows
    versions, admission, attention, minimind = (rows[n] for n in ("1 versions", "2 admission", "3 attention",
                                                                   "6 minimind"))
    # the line that failed on every GPU (metrics.peak_bf16_flops) now runs here: the H200's bf16 entry
    assert versions["status"] == "ok" and versions["branches"] == ["cuda"], versions
    assert "NVIDIA H200; peak entry 'H200': 989 TFLOP/s bf16" in versions["figures"]
    assert admission["status"] == "ok", admission
    assert admission["branches"] in (["fake nvml"], ["nvml"]) and "MIG instances" in admission["figures"]
    if admission["branches"] == ["fake nvml"]:
        assert "MIG instances 2" in admission["figures"] and ": busy (1 foreign process: pid" in admission["figures"]
    assert attention["status"] == "ok" and attention["branches"] == ["cuda"], attention
    assert "bf16 causal on cpu: " in attention["figures"]  # the GPU's dtype, the CPU's tensors
    assert minimind["status"] == "skip"
    assert minimind["branches"] in (["command checked"], ["minimind absent"]), minimind
    if minimind["branches"] == ["command checked"]:
        assert "--hidden_size 768 --num_hidden_layers 8 --max_seq_len 1024 --batch_size 64" in minimind["figures"]
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_failing_part_still_gets_its_row_and_the_table_and_summary_are_written(tmp_path):
    # part 1 raises, part 6 after it dies without a result line: both rows, the table, summary.json, exit 1
    done, rows = gpu_check(tmp_path, "--only", "1 versions,6 minimind",
                           env={"MINILMD_GPU_CHECK_FAIL": "1 versions,6 minimind:exit"})
    assert list(rows) == ["1 versions", "6 minimind"]
    assert rows["1 versions"]["status"] == "fail", rows
    assert rows["1 versions"]["figures"].startswith("RuntimeError: injected failure")
    assert rows["6 minimind"]["status"] == "fail" and rows["6 minimind"]["figures"].startswith("exit 3, no result line")
    assert "part           status  seconds  figures" in done.stdout and done.returncode == 1


def read_train_lines(run_dir: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [m for m in lines if m["kind"] == "train"]


@pytest.mark.slow
def test_the_dry_run_dpo_part_starts_both_from_one_sft_export_at_ln_2_and_times_the_reference(dry_run):
    done, rows, tmp_path = dry_run.done, dry_run.rows, dry_run.work
    dpo = rows["9 dpo"]
    assert dpo["status"] == "ok", dpo
    assert dpo["branches"][:3] == ["minilmd sft", "sft exported", "minilmd dpo"], dpo
    assert dpo["branches"][3:] in (["dpo command checked"], ["minimind absent"]), dpo
    assert "minilmd step 1 loss 0.693147 (ln 2 0.693147)" in dpo["figures"] and " real tok/s (median" in dpo["figures"]
    assert "reference once: " in dpo["figures"] and "s (computed)" in dpo["figures"]
    assert "from 3 SFT steps' weights" in dpo["figures"]
    assert list((tmp_path / "minimind-dpo" / "out").glob("full_sft_64.pth"))  # the weights both start from
    assert "initialised from " + str(tmp_path / "minimind-dpo" / "out" / "full_sft_64.pth") in \
        (tmp_path / "9-dpo.log").read_text()
    if dpo["branches"][3:] == ["dpo command checked"]:
        assert "--from_weight full_sft --hidden_size 64 --num_hidden_layers 2 --max_seq_len 256 --batch_size 4 " \
               "--learning_rate 4e-08 --beta 0.15" in dpo["figures"]
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_the_dry_run_runs_every_part_and_part_5_resumes_bit_exact(dry_run):
    # under a --budget: each part runs with its share (MINILMD_GPU_CHECK_PART_S), none is left unstarted
    done, rows, tmp_path = dry_run.done, dry_run.rows, dry_run.work
    assert list(rows) == ["0 corpus", "1 versions", "2 admission", "3 attention", "4 eager", "4 compiled",
                          "4 second shape", "4 bench step", "5 run", "5 determinism", "6 minimind", "7 oom", "8 sft",
                          "9 dpo"]
    assert not [r for r in rows.values() if r["figures"].startswith("not started")], rows
    assert "part           status  seconds  figures" in done.stdout  # the table, printed
    status = {name: r["status"] for name, r in rows.items()}
    assert status["0 corpus"] == status["1 versions"] == status["3 attention"] == status["4 eager"] == "ok", rows
    assert status["2 admission"] == "ok" and rows["2 admission"]["figures"].startswith("no NVML (")
    assert "on cpu: " in rows["3 attention"]["figures"] and "no SDPA kernel" not in rows["3 attention"]["figures"]
    assert "tok/s" in rows["4 eager"]["figures"] and "checkpoint blocking_s 0." in rows["4 eager"]["figures"]
    assert rows["4 eager"]["figures"].startswith("4 timed steps (")  # the dry run's planned steps
    assert ", attention default (default), " in rows["4 eager"]["figures"]  # the run's recorded choice (CPU: torch's)
    # the compile path of the trainer with TORCHDYNAMO_DISABLE=1: its compiling step timed apart
    assert status["4 compiled"] == "ok" and rows["4 compiled"]["branches"] == ["compiled", "compile disabled"]
    compiled, eager = (read_train_lines(tmp_path / name / "run") for name in ("compiled", "eager"))
    compiled = [m for m in compiled if m["step"] <= 6]  # part 4's own steps (part 5 run carried its run on)
    assert compiled[0]["compile_s"] > 0 and all(m["compile_s"] == 0 for m in compiled[1:] + eager)
    assert "compile_s " in rows["4 compiled"]["figures"]
    second = rows["4 second shape"]  # the second model's shape (768 x 16 at T=768 on the GPU), a run of its own
    assert second["status"] == "ok" and second["figures"].startswith("64 x 4 at T=48, 4 timed steps"), second
    assert status["6 minimind"] == "skip"
    bench = rows["4 bench step"]
    assert bench["status"] == "ok", bench
    # the loop over the bench, each mode, and the kernels both run (the bench sets them as the trainer does)
    assert re.match(r"3 timed steps a mode: loop / bench step tok/s \(goal >= 0.97\): compiled [\d,]+ / [\d,]+ = "
                    r"[\d.]+, eager [\d,]+ / [\d,]+ = [\d.]+ \| kernels: attention default \(default\), "
                    r"deterministic algorithms off \(train.deterministic = true applies on CUDA only: the cpu's "
                    r"kernels are deterministic already\)", bench["figures"]), bench
    run = rows["5 run"]  # part 4 compiled's run carried on under `minilmd run`, killed, restarted
    assert run["status"] == "ok", run
    assert run["figures"].startswith("part 4 compiled carried on from step 6 to 14, SIGKILL at step 7; ")
    assert "['killed', 'done']" in run["figures"]
    assert "s from the kill to the first new optimizer step" in run["figures"]  # the restart time
    det = rows["5 determinism"]  # issue 41: two runs, the killed one, the negative controls, the cost
    assert det["status"] == "ok", det
    assert det["figures"].startswith("two undisturbed runs (6 steps eager, attention auto): weights verified, "
                                     "max |diff| 0 "), det
    assert "part 5 run's, SIGKILLed and restarted (14 steps compiled) vs an undisturbed one on the same compile " \
           "cache: weights verified, max |diff| 0 vs undisturbed (bit-exact)" in det["figures"]
    assert "; eager resume from step 4: weights verified, max |diff| 0 vs undisturbed (bit-exact); " in det["figures"]
    assert "resume from step 4 without the AdamW moments: caught as different" in det["figures"]
    assert "RNG" not in det["figures"]  # the unjudged control replaced by the judged eager resume
    assert "cost of determinism: compiled deterministic " in det["figures"] and "eager deterministic " in det["figures"]
    # its verdicts printed before the cost of determinism's runs, then after each: a kill keeps them
    provisional = [json.loads(line[len("GPU-CHECK-RESULT "):]) for line in
                   (tmp_path / "5-determinism.log").read_text().splitlines() if line.startswith("GPU-CHECK-RESULT ")]
    assert [r.get("provisional") for r in provisional] == [True, True, True, None], provisional
    assert provisional[0]["figures"].endswith("; cost of determinism: not measured yet"), provisional[0]
    assert "eager resume from step 4: weights verified" in provisional[0]["figures"]
    assert "(4 timed steps)" in det["figures"] and "left out" not in det["figures"]
    sft = rows["8 sft"]  # bench sft on a chat corpus beside MiniMind's train_full_sft.py (its command, dry)
    assert sft["status"] == "ok", sft
    assert sft["branches"][0] == "bench sft" and sft["branches"][1:] in (["sft command checked"], ["minimind absent"])
    assert sft["figures"].startswith("T=64, 3 timed steps a mode: ")
    assert "bucketed/static real tokens/s: " in sft["figures"] and "padfree " in sft["figures"]
    oom = rows["7 oom"]  # the trainer's OOM handler, through its injected torch.OutOfMemoryError
    assert oom["status"] == "ok" and oom["branches"] == ["injected oom"], oom
    assert oom["figures"].startswith("exit 76; fault.json {") and '"source": "allocator"' in oom["figures"], oom
    assert rows["9 dpo"]["status"] == "ok" and "minilmd step 1 loss 0.693147" in rows["9 dpo"]["figures"], rows
    assert done.returncode == (0 if "fail" not in status.values() else 1)


def test_under_a_spent_budget_no_part_starts_and_each_gets_a_skip_row(tmp_path):
    done, rows = gpu_check(tmp_path, "--only", "1 versions,0 corpus", "--budget", "0")
    assert list(rows) == ["1 versions", "0 corpus"]  # the order given, not PARTS' order
    for row in rows.values():
        assert row["status"] == "skip" and row["figures"] == "not started: under 20s left of the --budget of 0s", row
    assert not (tmp_path / "1-versions.log").exists()  # never spawned
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dpo_part_is_not_started_without_its_minimum_of_the_budget(tmp_path):
    # 50 s would start any other part (20 s), not the DPO part: two trainers, a preparation and an export need 60
    done, rows = gpu_check(tmp_path, "--only", "9 dpo", "--budget", "50")
    assert rows["9 dpo"]["status"] == "skip", rows
    assert rows["9 dpo"]["figures"].startswith("not started: under 60s left of the --budget of 50s"), rows
    assert not (tmp_path / "9-dpo.log").exists() and done.returncode == 0


def test_a_parts_timeout_is_cut_to_the_budget_left():
    from gpu_check_scripts import load_scripts

    check, plan = load_scripts()
    assert check.part_timeout("4 compiled", None) == plan.TIMEOUTS["4 compiled"] == 300
    assert check.part_timeout("4 compiled", 1000.0) == 300
    assert check.part_timeout("4 compiled", 75.5) == 75.5
    assert check.part_timeout("4 compiled", check.MIN_PART_S - 0.1) is None


@pytest.mark.slow
def test_the_device_wrapper_runs_on_a_bare_python_and_leaves_the_table_and_logs_in_out(tmp_path):
    # a device machine's image: torch and the rest importable, minilmd not installed
    import site
    import venv

    image = tmp_path / "image"
    venv.create(image, with_pip=False)
    python = image / "bin" / "python"
    site_dir = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    # the test's own packages as plain path entries: their .pth files, minilmd's editable finder among them, unread
    (Path(site_dir) / "image.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # the image's environment: no PYTHONPATH (a worktree's, set to run the suite there, holds minilmd itself)
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert subprocess.run([str(python), "-c", "import torch, tokenizers"], cwd=tmp_path, env=bare).returncode == 0
    assert subprocess.run([str(python), "-c", "import minilmd"], cwd=tmp_path, capture_output=True,
                          env=bare).returncode != 0
    out = tmp_path / "out"
    env = {**bare, "OUT": str(out), "PYTHON": str(python), "TMPDIR": str(tmp_path),
           "GPU_CHECK_CARRIED": str(tmp_path / "nothing-carried"), "GPU_CHECK_ARGS": "--dry-run",
           "GPU_CHECK_ONLY": "1 versions,0 corpus"}
    done = subprocess.run(["bash", str(SCRIPTS / "gpu-check-device"), "run"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "requirements.txt", "setup.log",
                                                     "summary.json", "table.txt"]  # within the tool's 8 files
    setup = (out / "setup.log").read_text()
    assert setup.startswith("minilmd linked into "), setup
    # the budget: the call's 600 s less the setup's seconds and the 40 s kept for the archive and the last kill
    spent = int(re.search(r"gpu-check-device: setup (\d+)s; --budget (\d+)s of the call's 600s", setup).group(1))
    assert f"--budget {600 - 40 - spent}s of the call's 600s" in setup, setup
    *requirements, layout = (out / "requirements.txt").read_text().splitlines()
    assert requirements[0].startswith("torch ") and all(r.endswith(" ok") for r in requirements), requirements
    root = SCRIPTS.parent
    assert f"daemon {root / 'daemon'}, trainer {root / 'trainer'}" in layout, layout  # package-dir's mapping
    rows = json.loads((out / "summary.json").read_text())
    assert [(r["part"], r["status"]) for r in rows] == [("1 versions", "ok"), ("0 corpus", "ok")], rows
    assert "part           status  seconds  figures" in (out / "table.txt").read_text()
    listed = subprocess.run(["tar", "tzf", str(out / "logs.tar.gz")], capture_output=True, text=True).stdout
    assert {"./1-versions.log", "./0-corpus.log"} <= set(listed.split()) and "text.jsonl" not in listed


# --- a part killed at its timeout: what it measured kept, what its runs left killed ----------------------------
FAKE_PART = """
import json, os, pathlib, subprocess, sys, time
from minilmd import names, procs
from minilmd.daemon.child.orphans import record_launch
work = pathlib.Path(sys.argv[1])
run_dir = work / "fake" / "run"
run_dir.mkdir(parents=True)
# a supervised run's trainer: a session of its own, the run's directory and launch id in its environment
env = {**os.environ, names.RUN_DIR_ENV: str(run_dir.resolve()), names.LAUNCH_ID_ENV: "ab" * 16}
trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
record_launch(run_dir, 1, "ab" * 16, trainer.pid, procs.process_start_ticks(trainer.pid))
(work / "trainer.pid").write_text(str(trainer.pid))
print("GPU-CHECK-RESULT " + json.dumps({"status": "ok", "figures": "measured 42 tok/s", "branches": ["fake"],
                                        "provisional": True}), flush=True)
time.sleep(300)  # past its timeout: killed
"""


@pytest.mark.slow
def test_a_part_killed_at_its_timeout_keeps_what_it_measured_and_its_runs_trainer_is_killed(tmp_path):
    from gpu_check_scripts import load_scripts
    from minilmd import names, procs

    check, _ = load_scripts()
    (tmp_path / "fake-part.py").write_text(FAKE_PART)
    # a process of the same run directory but another launch than the recorded one: not the run's trainer, kept
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                             env={**os.environ, names.RUN_DIR_ENV: str((tmp_path / "fake" / "run").resolve()),
                                  names.LAUNCH_ID_ENV: "cd" * 16})
    try:
        # 15 s: well past the fake's start and result line (about 1 s, more under load), the rest a worker's wait
        row = check.spawn("4 eager", tmp_path, False, 15, command=[sys.executable, str(tmp_path / "fake-part.py"),
                                                                   str(tmp_path)])
        trainer = int((tmp_path / "trainer.pid").read_text())
        assert row["status"] == "fail" and row["branches"] == ["fake"], row
        assert row["figures"].startswith("timeout after 15s; measured before: measured 42 tok/s; "), row
        assert row["figures"].endswith(f"; killed what its runs left: pids [{trainer}]"), row
        assert procs.process_start_ticks(trainer) is None  # gone (or a zombie of init's, reaped soon)
        assert other.poll() is None  # not proven the run's: never signalled
    finally:
        other.kill()
        other.wait()


def test_a_parts_row_is_its_last_result_and_a_provisional_one_alone_is_a_failure():
    from gpu_check_scripts import load_scripts

    check, _ = load_scripts()
    def line(result: dict) -> str:
        return "GPU-CHECK-RESULT " + json.dumps(result)

    out = "\n".join([line({"status": "ok", "figures": "first", "provisional": True}),
                     line({"status": "ok", "figures": "all of it", "branches": ["cuda"]})])
    assert check.read_result(out, 0, None, []) == {"status": "ok", "figures": "all of it", "branches": ["cuda"]}
    crashed = check.read_result(out.splitlines()[0] + "\nSegmentation fault", -11, None, [])
    assert crashed["status"] == "fail" and crashed["figures"] == "exit -11 after a provisional result: first"
    assert check.read_result("", -9, 25.0, [7])["figures"] == \
        "timeout after 25s, no result line yet; killed what its runs left: pids [7]"
