"""Issue 40's attacks on what minilmd writes into a place another user can change, each by a real second user
(nobody, through setpriv) against the victim (root, this process), each reproduced on the code before the fix:

- `prepare` with more than 20 bad lines into a group-writable team directory (not sticky): he renamed the
  temporary directory and put his own in its place, its `bad-lines.txt` a link to her private file; the chmod that
  makes the list readable made her 0600 file world-readable;
- `prepare --append` there: with the temporary directory swapped, the append exited 0 with his tokens in her
  corpus (meta.json hashing them);
- `prepare --force` there: he renamed another corpus of hers to the --out name while it ran, and the swap deleted
  it for good;
- a Prometheus textfile directory he owns was accepted: he could replace her final gauges afterwards.

Now such a directory of --out is refused (exit 2, scratch's message) unless she passes --group-share, and even
then everything in it goes through the directory opened once (minilmd/dirfd.py): the attacks find nothing to
follow, and --force replaces only the corpus whose identity it checked. The attack runs at a fixed moment: inside
a progress display given to prepare (its last, forced update: the whole input read, nothing published yet).
"""
from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from data_helpers import run_prepare
from minilmd.config import ConfigError
from minilmd.corpus.prepare.append import append
from minilmd.daemon import preflight
from minilmd.daemon.base.runstate import RunState, new_state
from minilmd.daemon.host import prometheus
from minilmd.path_checks import textfile_dir_problem
from second_user import second_user, shared, team, user_python  # noqa: F401 - shared, team: fixtures
from supervisor_helpers import write_config

pytestmark = [pytest.mark.root, pytest.mark.slow]

SECRET = b"her private notes\n"


class AttackWhenRead:
    """A progress display (prepare's `progress`) that runs `attack` at its last update, forced once the whole
    input is read: the temporary directory made and filled, nothing published yet."""

    def __init__(self, attack):
        self.attack = attack
        self.ran = False

    def update(self, done_bytes, tokens, docs, force=False):
        if force and not self.ran:
            self.ran = True
            self.attack()

    def close(self):
        pass


def _outcome(fn) -> Exception | None:
    """What the victim's command ended with: None (done) or its error; the assertions on her files come first."""
    try:
        fn()
    except (ValueError, OSError) as e:
        return e
    return None


def _as_nobody(code: str, *args: str) -> None:
    done = subprocess.run(user_python(code, *args), capture_output=True, text=True, cwd="/", timeout=120)
    assert done.returncode == 0, done.stderr




@pytest.fixture
def secret(shared):
    path = shared / "notes.txt"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


SWAP_TMP = """
import os, sys
team, prefix = sys.argv[1], sys.argv[2]
[tmp] = [n for n in os.listdir(team) if n.startswith(prefix)]
os.rename(os.path.join(team, tmp), os.path.join(team, "moved-by-him"))  # a rename needs only the parent's write
his = os.path.join(team, tmp)
os.mkdir(his, 0o777)
for split in ("train", "val"):
    os.mkdir(os.path.join(his, split), 0o777)
"""

PLANT_LINK = SWAP_TMP + """
os.symlink(sys.argv[3], os.path.join(his, "bad-lines.txt"))
moved = os.path.join(team, "moved-by-him")
for name in ("train/leak-keys.u64", "val/tokens.unchecked"):  # her own streams: her prepare goes on
    os.symlink(os.path.join(moved, name), os.path.join(his, name))
"""


def _bad_source(demo_jsonl, where: Path) -> Path:
    lines = Path(demo_jsonl[0]).read_text(encoding="utf-8").splitlines()[:60]
    path = where / "with-bad-lines.jsonl"
    path.write_text("\n".join(lines + ["{not json"] * 25) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("group_share", [False, True])
def test_a_swapped_temporary_directory_never_makes_her_private_file_readable(team, secret, tmp_path, demo_jsonl,
                                                                             tokenizer, group_share):
    """Before: his `bad-lines.txt` link in the swapped-in directory, and `os.chmod(spool, 0o644)` followed it:
    her 0600 notes became readable by everyone. Now the team directory is refused (exit 2, scratch's message);
    with --group-share the list is moved through the temporary directory's own descriptor, and the swapped name
    stops the publication (nothing of his published, nothing of hers changed)."""
    source = _bad_source(demo_jsonl, tmp_path)
    out = team / "corpus"
    attack = AttackWhenRead(lambda: _as_nobody(PLANT_LINK, str(team), ".corpus.prepare-", str(secret)))
    kw = {"group_share": True} if group_share else {}
    error = _outcome(lambda: run_prepare([source], tokenizer, out, val_fraction=0.1, on_bad_line="skip",
                                         progress=attack, **kw))
    assert _mode(secret) == 0o600 and secret.read_bytes() == SECRET
    assert isinstance(error, ValueError), error
    if group_share:
        assert attack.ran
        assert "temporary directory was replaced" in str(error), error
        assert not out.exists()  # nothing published: not his directory, not hers half checked
        listing = team / "corpus.bad-lines.txt"
        assert not listing.is_symlink()
        assert listing.read_text().count("invalid json") == 25  # her list, through her directory's descriptor
    else:
        assert not attack.ran
        said = str(error)
        assert f"the directory of --out {team}: the directory {team} can be written by other users (mode 770, not " \
               "sticky)" in said, said
        assert "--group-share" in said
        assert sorted(p.name for p in team.iterdir()) == []  # nothing made there, not even the lock file


INJECT = SWAP_TMP + """
moved = os.path.join(team, "moved-by-him")
# her leak keys, through a link (complete once her prepare has closed them); his own text's tokens instead of hers
os.symlink(os.path.join(moved, "train", "leak-keys.u64"), os.path.join(his, "train", "leak-keys.u64"))
os.symlink(os.path.join(moved, "val", "tokens.unchecked"), os.path.join(his, "val", "tokens.unchecked"))
with open(os.path.join(his, "train", "tokens.bin"), "wb") as f:
    f.write(bytes([3, 0]) * (4 << 20))  # more than she wrote: her copy reads only her documents' lengths of it
"""


def _corpus_tokens(root: Path) -> dict[str, bytes]:
    return {f"{split}/{name}": (root / split / name).read_bytes() for split in ("train", "val")
            for name in ("tokens.bin", "doc_lengths.npy")}


@pytest.mark.parametrize("group_share", [False, True])
def test_an_append_in_a_team_directory_appends_only_her_tokens(team, tmp_path, demo_jsonl, tokenizer,
                                                               group_share):
    """Before: the append's temporary directory was used by its name; swapped for his, the append exited 0 with
    his tokens in her train split (and meta.json hashing them). Now the team directory is refused; with
    --group-share the append works in its own directory's descriptor: her corpus holds exactly what the same
    append gives in a private directory."""
    private = tmp_path / "private"
    run_prepare(demo_jsonl[:1], tokenizer, private, val_fraction=0.1)
    corpus = team / "corp"
    shutil.copytree(private, corpus)
    before = _corpus_tokens(corpus)
    control = tmp_path / "control"
    shutil.copytree(private, control)
    append([demo_jsonl[1]], control, workers=0, progress=False, log=lambda m: None)
    attack = AttackWhenRead(lambda: _as_nobody(INJECT, str(team), ".corp.append.prepare-"))
    kw = {"group_share": True} if group_share else {}
    error = _outcome(lambda: append([demo_jsonl[1]], corpus, workers=0, progress=attack, log=lambda m: None, **kw))
    if group_share:
        assert _corpus_tokens(corpus) == _corpus_tokens(control)  # her tokens only, as a private append gives
        assert error is None and attack.ran
    else:
        assert _corpus_tokens(corpus) == before  # unchanged
        assert not attack.ran and "can be written by other users" in str(error), error


MOVE_HERS = """
import os, sys
team = sys.argv[1]
os.rename(os.path.join(team, "corpus"), os.path.join(team, "corpus-moved-by-him"))
os.rename(os.path.join(team, "corpA"), os.path.join(team, "corpus"))  # her other corpus, where --force replaces
"""


@pytest.mark.parametrize("group_share", [False, True])
def test_force_never_deletes_another_corpus_moved_to_its_name(team, tmp_path, demo_jsonl, tokenizer, group_share):
    """Before: he renamed her other corpus `corpA` to the --out name while `prepare --force` ran; the swap put the
    new corpus there and rmtree'd corpA for good. Now the team directory is refused; with --group-share --force
    replaces only the directory whose identity it checked under the lock: corpA is put back, nothing deleted."""
    private = tmp_path / "private"
    run_prepare(demo_jsonl[:1], tokenizer, private, val_fraction=0.1)
    if group_share:  # her prepare's own: in a team directory --force replaces nothing else (prepare_force_team)
        run_prepare(demo_jsonl[:1], tokenizer, team / "corpus", val_fraction=0.1, group_share=True)
    else:
        shutil.copytree(private, team / "corpus")
    run_prepare(demo_jsonl[:1], tokenizer, tmp_path / "other", val_fraction=0.3)  # her other corpus: another split
    shutil.copytree(tmp_path / "other", team / "corpA")
    hers = _corpus_tokens(team / "corpA")
    assert hers != _corpus_tokens(private)
    attack = AttackWhenRead(lambda: _as_nobody(MOVE_HERS, str(team)))
    kw = {"group_share": True} if group_share else {}
    error = _outcome(lambda: run_prepare(demo_jsonl[1:2], tokenizer, team / "corpus", val_fraction=0.1, force=True,
                                         progress=attack, **kw))
    where = "corpus" if group_share else "corpA"  # corpA, where he put it, or where she left it: whole
    assert (team / where).is_dir() and _corpus_tokens(team / where) == hers
    if group_share:
        assert attack.ran and "nothing was replaced" in str(error), error
        assert _corpus_tokens(team / "corpus-moved-by-him") == _corpus_tokens(private)
    else:
        assert not attack.ran and "can be written by other users" in str(error), error
    assert not [p for p in team.iterdir() if ".prepare-" in p.name and any(p.iterdir())]  # no copy of hers left


REPLACE_GAUGES = """
import os, sys
path = sys.argv[1]
os.unlink(path) if os.path.lexists(path) else None  # his directory: he may remove any name in it
with open(path, "w") as f:
    f.write('minilmd_up{run="s"} 1\\nminilmd_loss{run="s"} 0.01\\n')
"""


def test_a_textfile_directory_another_user_owns_is_refused(shared, tmp_path, corpus):
    """Before: `log.prometheus_textfile` in a directory of his was accepted and written; after her run ended he
    replaced her final gauges (up=1, loss 0.01). Now it gets the textfile directory's rule (run.dir's): `run
    --check` names it, and the supervisor never writes there (state.json's "prometheus" says why)."""
    uid, _ = second_user()
    his = shared / "collector"
    _as_nobody("import os, sys; os.mkdir(sys.argv[1], 0o1777)", str(his))
    assert his.stat().st_uid == uid
    path = his / "s.prom"
    problem = textfile_dir_problem(his)
    assert problem and f"belongs to user nobody (uid {uid})" in problem, problem
    config = write_config(tmp_path, corpus, remote=False, log={"prometheus_textfile": str(path)})
    with pytest.raises(ConfigError) as check:  # `run --check`, and the launch: exit 2
        preflight.check(str(config))
    assert problem in str(check.value), check.value
    state = RunState(shared / "state.json", new_state("s", shared / "run", "x.toml"))
    writer = prometheus.Textfile(str(path), state, lambda kind, message: None)
    writer.tick("training", force=True)
    writer.close("done")
    assert not path.exists()  # none of her gauges in his directory
    assert "belongs to user nobody" in state.data["prometheus"]["problem"], state.data["prometheus"]
    _as_nobody(REPLACE_GAUGES, str(path))  # what he does next changes nothing of hers: she never wrote there
    assert "in a directory others control" in state.data["prometheus"]["problem"]
