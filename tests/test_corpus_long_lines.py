"""One giant JSONL line (another user's corpus, or a broken export) read by `corpus report`, `corpus count` and
`bench prepare`'s raw floor: memory stays bounded whatever the line's length, and the line is skipped, counted as
bad and named `FILE:LINE: line too long (...)` (jsonl.Source.blocks, MAX_LINE_BYTES). Before, scan.py's
`readlines` and `Source.blocks` held the line whole: 2.1 GB of RSS for a 1 GiB line, MemoryError for 3 GiB.

The commands run as real processes under an address-space limit far below the line's size (a few hundred MiB:
the CLI does not import torch); the inputs are cheap: a sparse file (its NULs take no disk) and a gzip made of
repeated members (a few hundred KiB for hundreds of MiB of text)."""
from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd.corpus.analysis import scan
from minilmd.corpus.analysis.count import count
from minilmd.corpus.analysis.report import report
from minilmd.corpus.sources.jsonl import MAX_LINE_BYTES

ADDRESS_SPACE = 512 << 20
"""The children's limit: the CLI itself runs in under 200 MiB of address space; the lines below are 1 GiB and
768 MiB, which a reader holding them whole cannot take."""
SPARSE_BYTES = 1 << 30
GZ_LINE_MIB = 768
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2",
       "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _bounded(*argv: str) -> subprocess.CompletedProcess:
    """`python ARGV` under ADDRESS_SPACE; TimeoutExpired (a failure) if it hangs."""
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300,
                          preexec_fn=_limit_memory, env=ENV)


@pytest.fixture(scope="module")
def sparse(tmp_path_factory) -> Path:
    """Line 1 a document, line 2 a GiB of NULs (sparse: no disk), line 3 a document."""
    path = tmp_path_factory.mktemp("sparse") / "one.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"text": "hello"}\n')
        f.seek(SPARSE_BYTES)
        f.write(b'\n{"text": "after hello"}\n')
    assert path.stat().st_blocks * 512 < 1 << 20  # really sparse
    return path


@pytest.fixture(scope="module")
def gz_line(tmp_path_factory) -> Path:
    """A gzip whose line 2 is a valid document of GZ_LINE_MIB MiB: one compressed MiB of "a" repeated as gzip
    members (one stream to every gzip reader)."""
    path = tmp_path_factory.mktemp("gz") / "long.jsonl.gz"
    mib = gzip.compress(b"a" * (1 << 20), compresslevel=9)
    with open(path, "wb") as f:
        f.write(gzip.compress(b'{"text": "hello"}\n{"text": "'))
        for _ in range(GZ_LINE_MIB):
            f.write(mib)
        f.write(gzip.compress(b'"}\n{"text": "after hello"}\n'))
    assert path.stat().st_size < 4 << 20
    return path


def _named_line_2(text: str, path: Path, size: int) -> None:
    assert f"{path}:2: line too long (a line of {size:,} bytes" in text, text


@pytest.mark.slow  # a child reading a GiB
@pytest.mark.parametrize("which", ["sparse", "gz_line"])
def test_corpus_report_skips_and_names_a_giant_line_in_bounded_memory(which, request):
    path = request.getfixturevalue(which)
    size = SPARSE_BYTES - 18 if which == "sparse" else (GZ_LINE_MIB << 20) + len('{"text": ""}')
    done = _bounded("-m", "minilmd.cli", "corpus", "report", str(path), "--workers", "0")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "documents 2," in done.stdout and "lines not read: 1 bad (1 too long), 0 blank" in done.stdout
    _named_line_2(done.stdout, path, size)


@pytest.mark.slow  # a child reading a GiB
@pytest.mark.parametrize("which", ["sparse", "gz_line"])
def test_corpus_count_skips_and_names_a_giant_line_in_bounded_memory(which, request):
    path = request.getfixturevalue(which)
    size = SPARSE_BYTES - 18 if which == "sparse" else (GZ_LINE_MIB << 20) + len('{"text": ""}')
    done = _bounded("-m", "minilmd.cli", "corpus", "count", "hello", str(path), "--workers", "0", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(done.stdout)
    assert r["documents"] == 2 and r["bad_lines"] == 1 and r["patterns"][0]["occurrences"] == 2
    _named_line_2("\n".join(r["too_long_named"]), path, size)


@pytest.mark.slow  # a child reading a GiB
def test_bench_prepares_raw_floor_skips_and_names_a_giant_line_in_bounded_memory(sparse, gz_line, tokenizer):
    code = ("import sys; from minilmd.corpus.bench.prepare import raw_encode; "
            "from minilmd.corpus.sources.bad_tally import BadLineTally; bad = BadLineTally(); "
            "r = raw_encode(sys.argv[1:3], sys.argv[3], bad=bad); "
            "print(next(iter(r.values()))['tokens']); print('\\n'.join(bad.first))")
    done = _bounded("-c", code, str(sparse), str(gz_line), str(tokenizer))
    assert done.returncode == 0, done.stderr[-2000:]
    tokens, *named = done.stdout.splitlines()
    assert int(tokens) > 0 and len(named) == 2, done.stdout
    _named_line_2(named[0], sparse, SPARSE_BYTES - 18)
    _named_line_2(named[1], gz_line, (GZ_LINE_MIB << 20) + len('{"text": ""}'))


def test_an_over_long_line_is_named_by_its_line_number_whichever_shard_reads_it(tmp_path):
    """A plain file cut into shards: the line numbers of a shard's lines count those of the shards before it."""
    path = tmp_path / "mid.jsonl"
    with open(path, "wb") as f:
        for i in range(5):
            f.write(json.dumps({"text": f"before {i}"}).encode() + b"\n")
        f.write(b'{"text": "')
        f.seek(f.tell() + MAX_LINE_BYTES)  # sparse: a line just over the bound
        f.write(b'"}\n')
        for i in range(5):
            f.write(json.dumps({"text": f"after {i}"}).encode() + b"\n")
    corpus = scan.open_corpus(str(path), parts=7, min_bytes=1)
    assert len(corpus.shards) == 7
    seen = [t for shard in corpus.shards for b in scan._jsonl_batches(shard) for t in b.texts]
    assert seen == [f"before {i}" for i in range(5)] + [f"after {i}" for i in range(5)]
    r = report(str(path), workers=0)
    assert r["documents"] == 10 and r["bad_lines"] == 1
    assert [x.split(": ")[0] for x in r["too_long_named"]] == [f"{path}:6"]
    c = count(str(path), ["after"], workers=0)
    assert c["too_long_named"] == r["too_long_named"] and c["patterns"][0]["documents"] == 5
