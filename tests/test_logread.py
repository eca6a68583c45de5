"""minilmd/logread.py: a log's end read in bounded memory, a followed log's whole new lines."""
from __future__ import annotations

from minilmd import logread


def test_tail_lines_reads_only_the_end_of_a_large_file(tmp_path, monkeypatch):
    path = tmp_path / "big.log"
    with open(path, "w") as f:
        for i in range(200_000):
            f.write(f"line {i}\n")
    reads = []
    real_pread_all = logread._pread_all

    def counting(fd, size, offset):
        data = real_pread_all(fd, size, offset)
        reads.append(len(data))
        return data

    monkeypatch.setattr(logread, "_pread_all", counting)
    lines, size = logread.tail_lines(path, 3)
    assert lines == ["line 199997", "line 199998", "line 199999"] and size == path.stat().st_size
    assert sum(reads) <= 64 * 1024 < size


def test_tail_lines_edges(tmp_path):
    path = tmp_path / "x.log"
    assert logread.tail_lines(path, 5) == ([], 0)
    path.write_bytes(b"one\ntwo\nhalf")
    assert logread.tail_lines(path, 2) == (["two", "half"], 12)
    assert logread.tail_lines(path, 10) == (["one", "two", "half"], 12)
    assert logread.tail_lines(path, 0) == ([], 12)
    path.write_bytes(b"x" * 5000 + b"\nlast\n")
    assert logread.tail_lines(path, 5, max_bytes=100) == (["last"], 5006)  # the cut line is not shown as a line


def test_new_lines_follows_whole_lines_and_rotation(tmp_path):
    path = tmp_path / "m.jsonl"
    assert logread.new_lines(path, 0) == ([], 0)
    path.write_bytes(b"a\nb\nhal")
    lines, off = logread.new_lines(path, 0)
    assert lines == [b"a", b"b"] and off == 4
    with open(path, "ab") as f:
        f.write(b"f\nc\n")
    lines, off = logread.new_lines(path, off)
    assert lines == [b"half", b"c"] and off == 11
    path.write_bytes(b"new\n")  # rotated: shorter than the offset
    assert logread.new_lines(path, off) == ([b"new"], 4)
