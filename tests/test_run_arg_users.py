"""Root as another user's deputy (hostile5 F1, F2, F4, F5), with real users and a live run: the victim `nobody` trains
(a real `minilmd run` supervisor, tests/stop_victim.py's Victim); the attacker (uid 64123, through setpriv) puts a
link to her run directory, and a run config naming it, in a directory of his, and asks root to stop or forget "his"
run. Before, root's `minilmd stop` through either SIGTERMed her supervisor and left root's stop request in her run
directory (her automatic restart blocked), naming neither her run nor her; root's `minilmd forget` through the link
removed her live run's registry entry. Now the run argument's rule (daemon/views/runarg.py) refuses both, exit 2,
naming his link or config, him, and her run directory; root acting on her run by its own path is told whose it is
first; her own link and config to her own run are followed for root (review 6); root's `status` of her run
honours her own stop request as her supervisor does, and a corpus of root's is nobody's foreign corpus."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from minilmd import names, protocol
from second_user import as_user, second_user, shared, user_python  # noqa: F401  (shared: the fixture)
from stop_victim import ATTACKER, CLI, as_attacker, stop_as, victim  # noqa: F401  (victim: the fixture)

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROOT_CLI = [sys.executable, "-m", "minilmd.cli"]


def as_root(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ROOT_CLI, *args], capture_output=True, text=True, env=env, cwd="/", timeout=120)


def test_roots_stop_and_forget_through_another_users_link_or_config_leave_her_live_run_alone(shared, victim):
    registry_dir = shared / "no-system-registry"  # the Victim's system registry: a real sticky, shared one
    registry_dir.mkdir()
    registry_dir.chmod(0o1777)
    her = victim("hers")
    his, his_config = shared / "mal" / "run", shared / "mal2" / "run.toml"
    subprocess.run(as_attacker(["sh", "-c", f"mkdir {his.parent} {his_config.parent} && ln -s {her.run_dir} {his} && "
                                f"printf '[run]\\nname = \"x\"\\ndir = \"{her.run_dir}\"\\n' > {his_config}"]),
                   check=True, timeout=60)
    entries = sorted(os.listdir(registry_dir))
    assert any(name.startswith(f"{second_user()[0]}-hers-") for name in entries), entries
    env = {**her.env, "HOME": "/root", "XDG_STATE_HOME": str(shared / "root-state")}
    for arg, what in ((his, "a symbolic link"), (his_config, "a run config")):
        done = as_root(env, "stop", str(arg))
        assert done.returncode == protocol.STOP_NOT_A_RUN, done
        assert (f"{arg} is {what} of uid {ATTACKER}, not root's: it leads to the run directory {her.run_dir} of "
                f"user nobody (uid {second_user()[0]})") in done.stderr, done
        assert "nothing signalled, nothing written" in done.stderr and "SIGTERM" not in done.stdout, done
        her.assert_alive()
        assert not (her.run_dir / names.STOP_REQUEST).exists()
    done = as_root(env, "forget", str(his))
    assert done.returncode == 2 and f"{his} is a symbolic link of uid {ATTACKER}" in done.stderr, done
    done = as_root(env, "forget", str(her.run_dir))  # by its own path: a running run stays listed
    assert done.returncode == 1 and f"kept {her.run_dir}: its supervisor (pid {her.supervisor.pid})" in done.stdout
    assert sorted(os.listdir(registry_dir)) == entries
    her.assert_alive()

    current, her_config = shared / "hers-links" / "current", shared / "hers-links" / "run.toml"
    subprocess.run(as_user(["sh", "-c", f"mkdir {current.parent} && ln -s {her.run_dir} {current} && "
                            f"printf '[run]\\nname = \"x\"\\ndir = \"{her.run_dir}\"\\n' > {her_config}"]),
                   check=True, timeout=60)
    for arg in (current, her_config):  # her own link and config to her own run: followed for root (review 6, 1)
        done = as_root(env, "status", str(arg))
        assert done.returncode == 0 and str(her.run_dir) in done.stdout, done
    her.assert_alive()

    done = stop_as(None, her.run_dir, her.env)  # she stops her own run: her stop request stays in her run dir
    assert done.returncode == protocol.STOP_DONE and her.supervisor.wait(60) == 0, done
    assert os.stat(her.run_dir / names.STOP_REQUEST).st_uid == second_user()[0]
    done = as_root(env, "status", str(her.run_dir))  # judged as her supervisor judges it: hers is honoured
    assert done.returncode == 0 and "stop requested at" in done.stdout and "not honoured" not in done.stdout, done
    hers = subprocess.run(user_python(CLI, "status", str(her.run_dir)), capture_output=True, text=True,
                          env=her.env, cwd="/", timeout=120)
    assert os.stat(shared / "corpus").st_uid == 0  # root's, as an admin's shared corpus: no other user's to her
    assert hers.returncode == 0 and "belongs to user root" not in hers.stdout + hers.stderr, hers
    done = as_root(env, "stop", str(her.run_dir))  # root on her run by its own path: told whose it is, first
    first = done.stdout.splitlines()[0]
    assert first == (f"{her.run_dir}: a run directory of user nobody (uid {second_user()[0]}), not yours, user root "
                     f"(uid 0): stopping it"), done
    assert done.returncode == protocol.STOP_DONE and "not running" in done.stdout, done
