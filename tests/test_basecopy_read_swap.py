"""`export --merge` and `sample` of an adapter whose base is gone read the base's copy on the remote
(`<remote>/init`, trainer/model/basecopy_read.py). Before, each directory of it was looked at (an lstat) and then its
files opened by path: a directory swapped for a symbolic link between the look and the open (whoever can write the
remote can) was followed, and the files read were the link's. Now each directory is walked to once without following
a link (remote_write.parent_dir, as daemon/jobs/remote.py reads a local remote) and every file of it read at that
descriptor (untrusted.open_regular with dir_fd): what is read is the directory looked at, whatever its name leads to
by then."""
from __future__ import annotations

import json
import shutil

from minilmd.daemon.jobs import basecopy, initstage
from minilmd.init_source import STAGED_CHECKPOINT, STAGED_RECORD
from minilmd.names import MANIFEST
from minilmd.trainer.model import basecopy_read
from weights_helpers import CHECKPOINT_MODEL, make_run, save_run

HERS = b"her private file, never to be read into the copy\n"


def _swapping_on_the_manifest(copy, elsewhere):
    """read_bytes as basecopy_read calls it, but when it comes to the checkpoint's manifest (the checkpoint
    directory already looked at) the directory is first renamed away and a link to `elsewhere` put in its place."""
    read_bytes = basecopy_read.read_bytes

    def swapped_then_read(path, **kwargs):
        if str(path).endswith(MANIFEST) and not (copy / STAGED_CHECKPOINT).is_symlink():
            (copy / STAGED_CHECKPOINT).rename(copy.parent / "moved-away")
            (copy / STAGED_CHECKPOINT).symlink_to(elsewhere)
        return read_bytes(path, **kwargs)

    return swapped_then_read


def test_a_directory_of_the_copy_swapped_for_a_link_after_its_look_is_never_followed(tmp_path, monkeypatch):
    """The copy's checkpoint directory swapped for a link to a directory of hers once it was looked at: before,
    the manifest (and every file after it) was read through the link (here: her manifest.json, so the copy was
    refused as not the manifest its record hashes). Now the files read are those of the directory walked to, and
    the private copy is the copy's, byte for byte; nothing of hers read."""
    model, opt = make_run(3)
    base = save_run(tmp_path / "share", 3, model, opt)
    staged = initstage.stage_init(str(base), tmp_path / "scratch")
    record = json.loads((staged / STAGED_RECORD).read_text())
    copy = shutil.copytree(staged, tmp_path / "remote" / basecopy.REMOTE_BASE)
    originals = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    hers = tmp_path / "hers"
    hers.mkdir()
    for rel in originals:
        if rel.parts[0] == STAGED_CHECKPOINT:
            (hers / rel.name).write_bytes(HERS)
    monkeypatch.setattr(basecopy_read, "read_bytes", _swapping_on_the_manifest(copy, hers))
    private = tmp_path / "private"
    private.mkdir()

    assert basecopy_read.private_copy(copy, record, dict(CHECKPOINT_MODEL), private)
    assert (copy / STAGED_CHECKPOINT).is_symlink()  # the swap happened
    assert {p.relative_to(private): p.read_bytes() for p in private.rglob("*") if p.is_file()} == originals
