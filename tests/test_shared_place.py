"""minilmd/shared_place.py: the one look that says why a file expected in a shared place is missing (the share gone,
an empty mount point, a place that cannot be listed: an outage; a place there and lacking it: not), and what each
of its four readers makes of it where they used to differ."""
from __future__ import annotations

import os
from pathlib import Path

import fsspec
import pytest

from minilmd.daemon.jobs import initstage
from minilmd.daemon.jobs.staging_errors import SourceInvalid
from minilmd.shared_place import Place, look
from scratch_helpers import two_users  # noqa: F401

META = "meta.json"
LOCAL = fsspec.filesystem("file")


def _make(case: str, tmp_path: Path) -> Path:
    place = tmp_path / "share" / "corpus"
    place.parent.mkdir()
    if case == "gone":
        return place
    if case == "link leading nowhere":  # ~/corpus -> /nfs/corpora/wiki, the share gone
        place.symlink_to(tmp_path / "nfs" / "wiki")
        return place
    if case == "a file where the directory belongs":
        place.write_text("not a directory")
        return place
    if case.startswith("link to"):
        target = tmp_path / "nfs" / "wiki"
        target.mkdir(parents=True)
        place.symlink_to(target)
        place = target
    else:
        place.mkdir()
    if case in ("dir with the file and others", "link to a dir with the file"):
        (place / META).write_text("{}")
        (place / "train").mkdir()
    elif case == "dir with other files only":
        (place / "notes.txt").write_text("not a corpus")
    elif case == "the file is a link":  # its reader refuses it, saying so: not the look's to call missing
        (place / META).symlink_to(tmp_path / "elsewhere.json")
    return tmp_path / "share" / "corpus"


TABLE = [
    ("gone", Place.GONE, "not there (its share gone?)"),
    ("empty dir", Place.EMPTY, "an empty directory (its share not mounted?)"),
    ("dir with the file and others", Place.THERE, ""),
    ("dir with other files only", Place.LACKS, "no meta.json"),
    ("the file is a link", Place.THERE, ""),
    ("link to a dir with the file", Place.THERE, ""),
    ("link to an empty dir", Place.EMPTY, "an empty directory (its share not mounted?)"),
    ("link leading nowhere", Place.GONE, "a link to nowhere (-> {nfs}/wiki: its share gone or not mounted?)"),
    ("a file where the directory belongs", Place.NOT_A_DIRECTORY, "not a directory (a regular file)"),
]


@pytest.mark.parametrize(("case", "place", "said"), TABLE, ids=[row[0] for row in TABLE])
def test_the_look_at_a_local_place(tmp_path, case, place, said):
    root = _make(case, tmp_path)
    for found in (look(root, META), look(str(root), META, LOCAL)):  # a path, or fsspec's local filesystem
        assert (found.place, str(found)) == (place, said.format(nfs=tmp_path / "nfs")), case
        assert found.outage == (place in (Place.GONE, Place.EMPTY))


def _unlistable(request, tmp_path) -> tuple[Path, object]:
    """A directory (holding a file) that may be searched but not listed, and `said(code)`: the stdout of a Python
    process running `code` (PLACE: the directory's path) as a user the directory refuses (root lists every
    directory: nobody runs it then)."""
    import subprocess
    import sys

    if os.geteuid() != 0:
        place = tmp_path / "share"
        place.mkdir()
        (place / "notes.txt").write_text("unlisted")
        place.chmod(0o300)
        request.addfinalizer(lambda: place.chmod(0o700))
        run = lambda code: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    else:
        users = request.getfixturevalue("two_users")
        place = users.root / "share"
        place.mkdir()
        (place / "notes.txt").write_text("unlisted")
        place.chmod(0o711)  # others may search it, not list it
        run = lambda code: users.python("nobody", code)

    def said(code: str) -> list[str]:
        done = run(f"PLACE = {str(place)!r}\n{code}")
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()
    return place, said


def test_a_place_that_cannot_be_listed_is_unreadable_and_said_so(request, tmp_path):
    """On main staging and the probe called a listing that fails "an empty directory (its share not mounted?)",
    and staging a corpus there so: waited for, but with a reason that sends the reader to the wrong mount. Still
    waited for, said as it is."""
    place, said = _unlistable(request, tmp_path)
    assert said("from minilmd.shared_place import look\nf = look(PLACE, 'meta.json')\nprint(f.place.value)\n"
                "print(f)") == [Place.UNREADABLE.value, "unreadable (permission denied)"]
    assert said("import fsspec\nfrom minilmd.daemon.jobs.staging import _meta_missing\n"
                "e = _meta_missing(fsspec.filesystem('file'), PLACE, PLACE)\nprint(type(e).__name__)\nprint(e)") == \
        ["SourceUnreachable", f"{place}: unreadable (permission denied)"]


class FailingStore:
    """A store (not local paths) whose every call fails as a stale mount does, or that holds `names` under root."""

    protocol = "memory"

    def __init__(self, names: list[str] | None = None):
        self.names = names

    def _listed(self) -> list[str]:
        if self.names is None:
            raise OSError(116, "Stale file handle")
        return self.names

    def exists(self, path: str) -> bool:
        return path == "/root" or path.rsplit("/", 1)[-1] in self._listed()

    def isdir(self, path: str) -> bool:
        return path == "/root"

    def ls(self, path: str, detail: bool = False) -> list[str]:
        return [f"/root/{n}" for n in self._listed()]


def test_the_look_in_a_store():
    memory = fsspec.filesystem("memory")
    memory.pipe_file("/store-corpus/notes.txt", b"x")
    assert look("/store-corpus", META, memory).place is Place.LACKS
    memory.pipe_file("/store-corpus/meta.json", b"{}")
    assert look("/store-corpus", META, memory).place is Place.THERE
    assert str(look("/no-such-prefix", META, memory)) == "not there (not reachable?)"
    assert str(look("/root", META, FailingStore())) == "unreadable (Stale file handle)"
    assert look("/root", META, FailingStore([])).place is Place.EMPTY


# --- what each reader makes of it -----------------------------------------------------------------------------------
def test_a_file_where_the_corpus_belongs_is_final_not_waited_for(tmp_path):
    """On main staging called a file where the corpus directory belongs "cannot be read" (the main corpus: its
    meta.json read failed with ENOTDIR) or let the read's error stand (the probe): SourceUnreachable, waited for
    without end, though no outage turns a directory into a file. Final now, said."""
    from minilmd.daemon.jobs.staging import stage

    place = _make("a file where the directory belongs", tmp_path)
    with pytest.raises(SourceInvalid, match=r"not a directory \(a regular file\)"):
        stage(str(place), tmp_path / "shm")
    with pytest.raises(SourceInvalid, match=r"not a directory \(a regular file\)"):
        initstage.stage_probe(str(place), tmp_path / "scratch")


@pytest.mark.parametrize("case", ["gone", "link leading nowhere", "empty dir"])
def test_the_config_check_waits_for_a_corpus_share_gone_behind_a_link(tmp_path, case):
    """data.prepared may be a link into the share (~/corpus -> /nfs/corpora/wiki): on main one that led nowhere
    (the share gone) was "no such directory" and never absent, so a restarted run was refused (exit 2) where the
    same corpus named by its own path was waited for. Both are absent now; a first launch still refuses both."""
    from minilmd.config import load_config
    from minilmd.probes import _check_prepared_dir
    from supervisor_helpers import write_config

    place = _make(case, tmp_path)
    cfg = load_config(write_config(tmp_path, (place, 512), remote=False))
    problems, absent, _ = _check_prepared_dir(cfg)
    said = {"empty dir": "is an empty directory now (its share not mounted?)",
            "gone": "is not there now (its share gone?)",
            "link leading nowhere": f"is a link to nowhere now (-> {tmp_path / 'nfs' / 'wiki'}: its share gone or "
                                    f"not mounted?)"}[case]
    assert absent == said and len(problems) == 1, (problems, absent)
