"""Whose run config `minilmd run` runs (hostile audit 9 F1), with a real second user (nobody, through setpriv) as
the teammate and root as the victim: her config in a team directory (group-writable for his group, not sticky)
replaced by his `mv`, his config named as her stage's init.from, his link to her config. Before, `run --check` said
OK and `run` ran his config in her name (his corpus, his lr, his sync.keep pruning her remote checkpoints; his
weights as her stage's base). Now every such config is refused (minilmd/config_file.py, the views' owner rule),
naming its owner and the way out; hers, and root's, in a directory no one else can rearrange, are read as before.
"""
from __future__ import annotations

import os
import shutil

import pytest

from minilmd.config import ConfigError, load_config, recorded_copy
from minilmd.config_file import ConfigRefused
from minilmd.init_source import InitSourceError, predecessor
from second_user import as_teammate, second_user, shared, team  # noqa: F401  (shared, team: fixtures)
from supervisor_helpers import cli, write_config

pytestmark = [pytest.mark.root]


def _problems(path) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(path)
    return "; ".join(e.value.problems)


def test_a_teammates_config_moved_over_hers_in_a_team_directory_is_refused_naming_him(tmp_path, corpus, team):
    uid, _ = second_user()
    mine = write_config(tmp_path, corpus, name="v9")
    hers = team / "vic.toml"
    shutil.copy(mine, hers)
    said = _problems(hers)  # hers, but in a directory he may rearrange: refused already
    assert f"the directory {team}" in said and "can be written by other users" in said, said
    assert "minilmd runs no config that others can replace" in said, said

    (team / "his.toml").write_text(mine.read_text().replace("max_steps = 30", "max_steps = 70"))
    os.chown(team / "his.toml", uid, uid)
    as_teammate(f"mv -f {team / 'his.toml'} {hers}")  # his `mv` over her name
    assert os.stat(hers).st_uid == uid
    said = _problems(hers)
    assert f"{hers} is a run config of user nobody (uid {uid}), not root's" in said, said
    assert f"copy it into a directory of your own (`cp {hers} ~/`)" in said, said

    checked = cli("run", "--check", str(hers), timeout=120)
    assert checked.returncode == 2 and "OK" not in checked.stdout, checked
    assert f"is a run config of user nobody (uid {uid})" in checked.stdout + checked.stderr, checked
    assert "Traceback" not in checked.stderr, checked


def test_his_config_or_his_link_in_a_sticky_shared_directory_is_refused_hers_there_is_read(tmp_path, corpus, shared):
    uid, _ = second_user()
    mine = write_config(tmp_path, corpus, name="v9")
    hers = shared / "hers.toml"
    shutil.copy(mine, hers)  # root's, in a sticky directory of root's: no one else may replace it
    assert load_config(hers).run.name == "v9"
    assert "name = \"v9\"" in recorded_copy(hers)

    as_teammate(f"cp {hers} {shared / 'his.toml'} && ln -s {hers} {shared / 'link.toml'}")
    said = _problems(shared / "his.toml")
    assert f"is a run config of user nobody (uid {uid}), not root's" in said, said
    said = _problems(shared / "link.toml")
    assert f"{shared / 'link.toml'} is a symbolic link of user nobody (uid {uid}), not root's" in said, said
    with pytest.raises(ConfigRefused):  # the supervisor's copy of it is read by the same rule
        recorded_copy(shared / "his.toml")

    own_link = tmp_path / "current.toml"
    own_link.symlink_to(hers)  # her own link to her own config: followed, as the views follow it
    assert load_config(own_link).run.name == "v9"


def test_init_from_naming_a_teammates_toml_is_refused_naming_him(tmp_path, corpus, shared):
    uid, gid = second_user()
    pre = write_config(tmp_path, corpus, name="pre")
    his = shared / "pre.toml"
    shutil.copy(pre, his)
    os.chown(his, uid, gid)
    with pytest.raises(InitSourceError) as e:
        predecessor(str(his))
    assert f"is a run config of user nobody (uid {uid}), not root's" in str(e.value), e.value
    assert "name that run's run directory instead" in str(e.value), e.value
    os.chown(his, 0, 0)
    assert predecessor(str(his)).name == "pre"  # root's own, there: the stage's base as before
