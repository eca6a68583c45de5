"""`minilmd status --all` (and `status` with no argument), the registry behind it, `minilmd forget`.

Three runs in three phases: root's (done) and two of a second real user, nobody (training, waiting for a GPU), plus
one of each user whose run directory vanished. Listed as nobody (a real other uid, through setpriv), root's run is
not there, nor is an entry nobody forged that names root's run directory; listed as root, every user's run is, but
not what a symlink nobody planted in the shared registry points to.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import new_state
from minilmd.daemon.host import registry
from minilmd.daemon.views import overview
from minilmd.fsio import atomic_write_json
from second_user import second_user, shared_dir, user_python


def make_run(root: Path, name: str, phase: str, **fields) -> Path:
    """A run directory whose state.json says phase (the supervisor: this test's process, alive)."""
    run_dir = root / name
    run_dir.mkdir()
    st = new_state(name, run_dir, str(root / f"{name}.toml"))
    st.update(phase=phase, **fields)
    atomic_write_json(run_dir / names.STATE, st)
    (run_dir / names.STATE).chmod(0o644)  # readable by all: only the registry's rules may hide it
    return run_dir


def as_nobody(code: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(user_python(code, *args), capture_output=True, text=True, cwd="/", timeout=60,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done


REGISTER = ("import sys\nfrom minilmd.daemon.host import registry\n"
            "registry.register(sys.argv[1], sys.argv[2], sys.argv[3])\n")
LIST = "from minilmd.daemon.views import overview\noverview.status_all(as_json=True)\n"


@pytest.mark.slow
@pytest.mark.root
def test_status_all_lists_what_each_user_may_see(monkeypatch):
    uid, gid = second_user()
    shared = shared_dir()
    try:
        system = shared / "system"  # what an admin makes of /var/lib/minilmd/runs: root's, sticky, world-writable
        system.mkdir()
        system.chmod(0o1777)
        t = time.time()
        theirs = {"XDG_STATE_HOME": str(shared / "nobody-state"), names.SYSTEM_REGISTRY_ENV: str(system)}
        root_done = make_run(shared, "r-done", "done", progress={"step": 100, "total_steps": 100, "loss": 2.5},
                             outcome={"exit": 0, "phase": "done", "time": t, "reason": "the run finished"})
        root_done.chmod(0o755)
        training = make_run(shared, "n-train", "training", devices=[0],
                            progress={"step": 40, "total_steps": 100, "loss": 3.25, "tok_s": 1234.0, "eta_s": 600},
                            sync={"state": "ok", "last_ok": t - 120}, restarts=[{"cause": "sigbus"}])
        waiting = make_run(shared, "n-wait", "waiting_gpu", gpu_wait={"since": t - 900, "devices": []})
        gone = make_run(shared, "n-gone", "training")
        for run_dir in (training, waiting, gone):
            for path in (run_dir, run_dir / names.STATE):
                os.chown(path, uid, gid)
        for run_dir in (training, waiting, gone):
            as_nobody(REGISTER, theirs, run_dir.name, str(run_dir), str(run_dir) + ".toml")
        shutil.rmtree(gone)
        # nobody forges an entry naming root's run, and plants a symlink to an entry of a run that is not registered
        forged = {"name": "forged", "run_dir": str(root_done), "config": "", "uid": 0, "registered": t}
        ghost = {"name": "ghost", "run_dir": str(shared / "ghost"), "config": "", "uid": uid, "registered": t}
        as_nobody("import json, os, sys\n"
                  "open(sys.argv[1], 'w').write(sys.argv[2])\nopen(sys.argv[3], 'w').write(sys.argv[4])\n"
                  "os.symlink(sys.argv[3], sys.argv[5])\n", theirs,
                  str(system / "0-forged.json"), json.dumps(forged), str(shared / "nobody-state" / "ghost.txt"),
                  json.dumps(ghost), str(system / "0-ghost.json"))

        monkeypatch.setenv("XDG_STATE_HOME", str(shared / "root-state"))
        monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(system))
        registry.register("r-done", root_done, str(root_done) + ".toml")
        root_gone = make_run(shared, "r-gone", "training")  # a vanished run dir has no owner left to compare
        registry.register("r-gone", root_gone, str(root_gone) + ".toml")
        shutil.rmtree(root_gone)

        seen_by_nobody = json.loads(as_nobody(LIST, theirs).stdout)
        assert {r["run"]: r["phase"] for r in seen_by_nobody} == {"n-train": "training", "n-wait": "waiting_gpu",
                                                                  "n-gone": "vanished"}
        shown = {r["run"]: r for r in seen_by_nobody}
        assert (shown["n-train"]["step"], shown["n-train"]["restarts"], shown["n-train"]["devices"]) == (40, 1, [0])
        assert shown["n-wait"]["gpu_waited_s"] >= 900
        text = as_nobody("from minilmd.daemon.views import overview\noverview.status_all()\n", theirs).stdout
        assert "r-done" not in text and "r-gone" not in text and "forged" not in text, text
        assert "held 0" in text and "waiting 15m" in text and "2m ago" in text and "1,234" in text, text
        assert "`minilmd forget NAME`" in text

        out = io.StringIO()
        assert overview.status_all(as_json=True, out=out) == 0
        seen_by_root = {r["run"]: r for r in json.loads(out.getvalue())}
        # every user's run, and no ghost: the planted symlink was not followed
        assert set(seen_by_root) == {"r-done", "r-gone", "n-train", "n-wait", "n-gone"}, seen_by_root
        assert seen_by_root["r-done"]["phase"] == "done" and seen_by_root["n-train"]["uid"] == uid

        forget = "import sys\nfrom minilmd.daemon.views import overview\nsys.exit(overview.forget(sys.argv[1]))\n"
        refused = subprocess.run(user_python(forget, "r-done"), capture_output=True, text=True, cwd="/", timeout=60,
                                 env={**os.environ, **theirs})
        assert refused.returncode == 1 and "no registered run of yours" in refused.stderr
        assert "forgot n-gone" in as_nobody(forget, theirs, "n-gone").stdout
        assert {r["run"] for r in json.loads(as_nobody(LIST, theirs).stdout)} == {"n-train", "n-wait"}
        assert [e.name for e in registry.entries()] == ["n-train", "n-wait", "r-done", "r-gone"]  # root's untouched
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_registry_entries_are_private_and_a_planted_symlink_is_not_followed(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "absent"))
    run_dir = make_run(tmp_path, "mine", "staging")
    written = registry.register("mine", run_dir, tmp_path / "mine.toml")
    assert written == [registry.user_dir() / registry.entry_name("mine", run_dir.resolve())]
    assert oct(registry.user_dir().stat().st_mode & 0o777) == "0o700"
    assert oct(written[0].stat().st_mode & 0o777) == "0o600"
    other = make_run(tmp_path, "elsewhere", "training")
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"name": "elsewhere", "run_dir": str(other)}))
    (registry.user_dir() / "elsewhere.json").symlink_to(target)
    assert [e.name for e in registry.entries()] == ["mine"]
    shutil.rmtree(registry.user_dir())
    registry.user_dir().parent.mkdir(parents=True, exist_ok=True)
    registry.user_dir().symlink_to(tmp_path)  # a registry directory that is a symlink is refused, not written through
    with pytest.raises(registry.RegistryUnsafe):
        registry.register("mine", run_dir, tmp_path / "mine.toml")


@pytest.mark.slow
def test_status_without_a_run_dir_lists_the_registered_runs(tmp_path):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"),
           names.SYSTEM_REGISTRY_ENV: str(tmp_path / "absent")}
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "minilmd.cli", *args], capture_output=True, text=True,
                              timeout=60, env=env)

    assert "no runs registered for you" in cli("status").stdout
    run_dir = make_run(tmp_path, "solo", "backoff", progress={"step": 7, "total_steps": 9})
    subprocess.run([sys.executable, "-c", REGISTER, "solo", str(run_dir), "x.toml"], env=env, check=True)
    lines = cli("status").stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN", "PHASE", "STEP"] and lines[1].split()[:3] == ["solo", "backoff", "7/9"]
    assert json.loads(cli("status", "--all", "--json").stdout)[0]["phase"] == "backoff"
    kept = cli("forget", "solo")  # by name: its run directory is there, kept (forget RUN_DIR forgets it)
    assert kept.returncode == 1 and "its run directory still exists" in kept.stdout, kept.stdout + kept.stderr
    assert cli("forget", str(run_dir)).returncode == 0 and "no runs registered" in cli("status").stdout
    assert cli("forget", "solo").returncode == 1


def _hint(rows: list[dict]) -> str:
    out = io.StringIO()
    overview._vanished_hint(rows, out)
    return out.getvalue().strip()


def test_the_gone_runs_hint_is_bounded_and_is_what_the_docs_quote():
    """Walk 4 #5: operations.md showed `minilmd forget NAME` where the walk's overview said `minilmd forget RUN_DIR`
    (its gone runs shared a name), in one line naming all 29. The docs quote both forms as the code prints them."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text(encoding="utf-8")
    quoted = [line for line in doc.splitlines() if line.startswith("run directories gone:")]
    unique = _hint([{"run": "demo", "phase": "done", "run_dir": "/tmp/demo-watch/run"},
                    {"run": "old", "phase": "vanished", "run_dir": "/tmp/demo-old/run"}])
    shared = _hint([{"run": "demo", "phase": "vanished", "run_dir": f"/tmp/demo-{i}/run"} for i in range(1, 30)])
    assert quoted == [unique, shared], (quoted, unique, shared)
    assert "`minilmd forget NAME`" in unique and "/tmp/demo-4/run" not in shared and "and 26 more" in shared
    assert len(_hint([{"run": f"r{i}", "phase": "vanished", "run_dir": f"/d/{i}"} for i in range(29)])) < 120


def test_forget_by_name_never_removes_a_run_whose_directory_still_exists(tmp_path, monkeypatch):
    """Found by a new user: three demos (every demo run is named `demo`), two of them deleted; the overview said
    `minilmd forget NAME`, and `minilmd forget demo` removed all three entries, the one training now too. By name it
    now forgets only the runs whose directory is gone, says which it kept and how to forget that one, and the
    overview suggests `minilmd forget RUN_DIR` when a name is shared."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(names.SYSTEM_REGISTRY_ENV, str(tmp_path / "absent"))
    runs = {}
    for where in ("live", "gone-1", "gone-2"):
        (tmp_path / where).mkdir()
        runs[where] = make_run(tmp_path / where, "demo", "training" if where == "live" else "done")
        registry.register("demo", runs[where], tmp_path / where / "demo.toml")
    for where in ("gone-1", "gone-2"):
        shutil.rmtree(runs[where])
    out = io.StringIO()
    assert overview.status_all(out=out) == 0
    hint = next(line for line in out.getvalue().splitlines() if line.startswith("run directories gone"))
    assert f"demo ({runs['gone-1']})" in hint and f"demo ({runs['gone-2']})" in hint, hint
    assert "`minilmd forget RUN_DIR`" in hint, hint

    out = io.StringIO()
    assert overview.forget("demo", out=out) == 0
    said = out.getvalue()
    assert said.count("forgot demo: removed ") == 2, said
    assert f"kept demo at {runs['live'].resolve()}: its run directory still exists" in said, said
    assert [e.run_dir for e in registry.entries()] == [runs["live"].resolve()]
    out = io.StringIO()
    assert overview.forget("demo", out=out) == 1  # nothing left to forget by name: kept again, said again
    assert "kept demo at" in out.getvalue() and [e.run_dir for e in registry.entries()] == [runs["live"].resolve()]
    assert overview.forget(str(runs["live"]), out=io.StringIO()) == 0  # by its path: the user means that one
    assert registry.entries() == []
