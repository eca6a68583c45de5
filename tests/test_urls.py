"""One rule for "is this a URL" and one way to open a place (minilmd/urls.py): fsspec's chained forms ("dir::/tmp",
"simplecache::/tmp") have no "://", and were read as local paths by the sites that asked `"://" in s`."""
from __future__ import annotations

import ast
import os

import pytest

import source_tree
from minilmd import init_source
from minilmd.corpus.analysis.scan import open_corpus
from minilmd.corpus.sources.jsonl import InputError, Source
from minilmd.daemon.jobs import remote_local, remotewait
from minilmd.daemon.preflight import local_remote_root
from minilmd.urls import chain_over_local, is_url, open_fs, protocol_of


@pytest.mark.parametrize(("place", "url", "protocol"), [
    ("/nfs/corpus", False, ""), ("relative/dir", False, ""), ("C://x", False, ""),
    ("file:///nfs/x", True, "file"), ("s3://bucket/x", True, "s3"), ("memory://x", True, "memory"),
    ("dir::/tmp", True, "dir"), ("simplecache::/tmp", True, "simplecache"),
    ("simplecache::s3://bucket", True, "simplecache"), ("data:,hello", True, "data")])
def test_a_url_is_what_fsspec_opens_as_one(place, url, protocol):
    assert (is_url(place), protocol_of(place)) == (url, protocol)


def test_open_fs_says_whether_the_place_is_local(tmp_path):
    assert open_fs(str(tmp_path)) == (open_fs(str(tmp_path)).fs, str(tmp_path), True)
    assert open_fs(f"file://{tmp_path}/").root == str(tmp_path) and open_fs(f"file://{tmp_path}").local
    assert not open_fs("memory://x").local and not open_fs("simplecache::memory://x").local


@pytest.mark.parametrize("chain", ["dir::{p}", "simplecache::{p}", "filecache::file://{p}", "blockcache::local://{p}",
                                   "simplecache::dir::{p}"])
def test_a_chain_over_a_local_path_is_refused_where_it_is_opened(tmp_path, chain):
    """Before, `simplecache::/nfs/team/remote` opened as an fsspec store (Remote), which writes by path: another user's
    link planted at LATEST in that shared directory had the sync overwrite the run's user's file it pointed to, and a
    50 MB LATEST was read whole (Remote.cat has no bound). Now no fsspec filesystem is made for it at all."""
    place = chain.format(p=tmp_path)
    assert chain_over_local(place) == str(tmp_path)
    with pytest.raises(ValueError, match=f"chain over the local path {tmp_path}.*name {tmp_path} itself"):
        open_fs(place)
    with pytest.raises(ValueError, match="chain over the local path"):
        remote_local.open_remote(place)
    with pytest.raises(InputError, match="chain over the local path"):  # a raw JSONL source of `prepare`
        Source(f"{place}/a.jsonl")


@pytest.mark.parametrize("place", ["/nfs/x", "file:///nfs/x", "s3://b/x", "simplecache::s3://b/x",
                                   "simplecache::memory://x"])
def test_no_other_place_is_a_chain_over_a_local_path(place):
    assert chain_over_local(place) is None


def test_a_chained_url_is_no_local_path_for_any_site(tmp_path):
    """Before: local_remote_root gave "dir::/..." back as a local root, init.from's check said nothing of a URL (it
    looked for a run directory named "dir::/..."), and corpus report tried to open "simplecache::..." as a file."""
    assert local_remote_root(f"dir::{tmp_path}") is None
    assert local_remote_root(f"file://{tmp_path}") == str(tmp_path)
    with pytest.raises(init_source.InitSourceError, match="URLs are not read"):
        init_source.resolve(f"dir::{tmp_path}")
    corpus = open_corpus("simplecache::memory://corpus/a.jsonl", parts=4)
    assert (corpus.kind, [s.end for s in corpus.shards]) == ("jsonl", [-1])  # one fsspec stream


def test_the_remote_is_local_as_open_fs_says(tmp_path):
    assert isinstance(remote_local.open_remote(str(tmp_path)), remote_local.LocalRemote)
    assert not isinstance(remote_local.open_remote("simplecache::memory://r"), remote_local.LocalRemote)
    assert remotewait.made_by_first_sync(f"dir::{tmp_path}/gone") == ""  # a store: nothing tells there


def test_a_chained_url_in_a_config_is_not_made_a_path_under_the_configs_directory(tmp_path):
    """Before, absolute_paths joined "dir::/data/corpus" (no "://") to the config's directory."""
    from minilmd.config import absolute_paths

    raw = {"data": {"prepared": "simplecache::memory://corpus"}, "run": {"remote": "dir::/nfs/ckpt"}}
    assert absolute_paths(raw, tmp_path) == []
    assert raw == {"data": {"prepared": "simplecache::memory://corpus"}, "run": {"remote": "dir::/nfs/ckpt"}}
    relative = {"data": {"prepared": "prep"}}
    assert absolute_paths(relative, tmp_path) == ["data.prepared"]
    assert relative["data"]["prepared"] == str(tmp_path / "prep")


URL_SPLITS = {"minilmd/urls.py": 4}
"""The files that spell "://" in code, and how often: urls.py's rule itself, and its split of a remote it has
already judged file:// or local:// (local_remote_root, moved from daemon/preflight.py for `run --check`). Anywhere
else a new `"://" in s` is the rule again."""


def test_no_module_but_urls_asks_whether_a_string_is_a_url():
    """A merge brought `"://" not in prepared` back (daemon/preflight.py's memory check read `dir::/x` as a relative
    path, and a file:// corpus not at all), after every other site had moved onto urls.is_url."""
    found = {}
    for path in source_tree.code_files():
        if '"://"' not in source_tree.source(path):
            continue
        count = sum(isinstance(node, ast.Constant) and node.value == "://"
                    for node in ast.walk(source_tree.tree(path)))
        if count:
            found[path.relative_to(source_tree.REPO).as_posix()] = count
    assert found == URL_SPLITS


def test_a_local_remote_is_one_place_however_it_is_spelled(tmp_path, corpus):
    """urls.local_remote_root is the one answer of the local path a run.remote names (a path, file://, local://).
    Three checks spelled their own: probes.has_checkpoint took a plain path only (`run --check` read init.from,
    and refused it as a typo, for a run that resumes from its file:// or local:// remote), checkpoint_select's roots
    file:// only (a trainer started by hand never looked in a local:// remote), and init.from's predecessor file://
    only (a run syncing to local:// was "a URL")."""
    from minilmd.checkpoint_select import checkpoint_roots
    from minilmd.config import load_config
    from minilmd.init_source import InitSourceError, _predecessor_of
    from minilmd.probes import has_checkpoint
    from supervisor_helpers import write_config

    remote = tmp_path / "nfs" / "remote"
    (remote / "step-00000010").mkdir(parents=True)
    (remote / "step-00000010" / "manifest.json").write_text("{}")
    seen = []
    for spelled in (str(remote), f"file://{remote}", f"local://{remote}/"):
        cfg = load_config(write_config(tmp_path, corpus, run={"remote": spelled}))
        try:
            predecessor = str(_predecessor_of(cfg, os.geteuid()).root)
        except InitSourceError as e:
            predecessor = str(e)
        seen.append((has_checkpoint(cfg), [str(root) for root in checkpoint_roots(cfg)], predecessor))
    assert seen[0][0] and str(remote) in seen[0][1], seen
    assert seen[1] == seen[0] and seen[2] == seen[0], seen
