"""Self tests of the fault fixtures: each fault observed through real syscalls on a real mount or cgroup.

They skip, with the reason, where the machine lacks root, /dev/fuse, fusermount3, libfuse3 or cgroup v1 memory.
"""
import errno
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import faults_fixtures
from faults_fixtures import faultfs_dirs, is_mounted, mounted_faultfs, unavailable_fuse
from waiting import wait_until

pytestmark = pytest.mark.root

PAGE = mmap.PAGESIZE


def make_file(fs, rel: str, data: bytes):
    path = fs.backing / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return fs.root / rel


# ---- skip reasons ----

def test_skip_reasons_name_what_is_missing(monkeypatch, tmp_path):
    if os.path.exists("/dev/fuse") and os.access("/dev/fuse", os.R_OK | os.W_OK):
        monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no fusermount3
        assert "fusermount3" in unavailable_fuse()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in faults_fixtures.unavailable_mount()
    assert "root" in faults_fixtures.unavailable_memory_cgroup()


# ---- FUSE ----

@pytest.mark.fuse
def test_passthrough_reads_writes_renames_on_the_backing_dir(faultfs):
    assert os.path.ismount(faultfs.root)
    make_file(faultfs, "corpus/a.bin", b"abc" * 1000)
    assert (faultfs.root / "corpus/a.bin").read_bytes() == b"abc" * 1000
    (faultfs.root / "remote").mkdir()
    (faultfs.root / "remote/x.tmp").write_bytes(b"payload")
    os.replace(faultfs.root / "remote/x.tmp", faultfs.root / "remote/x")
    assert (faultfs.backing / "remote/x").read_bytes() == b"payload"
    assert sorted(os.listdir(faultfs.root / "remote")) == ["x"]
    os.unlink(faultfs.root / "remote/x")
    assert not (faultfs.backing / "remote/x").exists()
    assert faultfs.hits() == []


@pytest.mark.fuse
def test_fail_reads_hits_new_and_already_open_files_only_for_the_glob(faultfs):
    data = os.urandom(3 * PAGE)
    target = make_file(faultfs, "corpus/train/tokens.bin", data)
    other = make_file(faultfs, "corpus/val/tokens.bin", b"fine")
    with open(target, "rb") as held:
        assert held.read() == data  # now in the page cache
        faultfs.fail_reads("corpus/train/*")
        held.seek(0)
        with pytest.raises(OSError) as caught:
            held.read()
        assert caught.value.errno == errno.EIO
    with pytest.raises(OSError) as caught:
        target.read_bytes()
    assert caught.value.errno == errno.EIO
    assert other.read_bytes() == b"fine"
    assert os.stat(target).st_size == len(data)  # metadata still works, like a server with bad blocks
    assert {h["path"] for h in faultfs.hits("error", "read")} == {"corpus/train/tokens.bin"}
    faultfs.clear()
    assert target.read_bytes() == data


@pytest.mark.fuse
def test_fail_reads_with_a_chosen_errno_and_basename_glob(faultfs):
    target = make_file(faultfs, "deep/dir/meta.json", b"{}")
    faultfs.fail_reads("meta.json", errno=errno.ESTALE)
    with pytest.raises(OSError) as caught:
        target.read_bytes()
    assert caught.value.errno == errno.ESTALE


@pytest.mark.fuse
def test_fail_reads_from_an_offset_breaks_a_copy_mid_file(faultfs):
    data = os.urandom(4 << 20)
    source = make_file(faultfs, "corpus/tokens.bin", data)
    faultfs.fail_reads("corpus/tokens.bin", from_offset=3 << 20)
    copied = bytearray()
    with pytest.raises(OSError) as caught:
        with open(source, "rb") as f:
            while chunk := f.read(64 * 1024):
                copied += chunk
    assert caught.value.errno == errno.EIO
    assert 0 < len(copied) < len(data) and bytes(copied) == data[:len(copied)]


@pytest.mark.fuse
def test_an_operation_held_in_a_stall_fails_when_an_error_rule_is_added(faultfs):
    source = make_file(faultfs, "corpus/tokens.bin", b"t" * 10000)
    stall_id = faultfs.stall("tokens.bin", seconds=300)
    outcome = {}

    def read():
        try:
            outcome["data"] = source.read_bytes()
        except OSError as e:
            outcome["errno"] = e.errno

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_until(lambda: faultfs.hits("stall"), 60, "the stall to fire", interval=0.01)
    faultfs.fail_reads("tokens.bin")
    faultfs.remove(stall_id)
    reader.join(timeout=30)
    assert outcome == {"errno": errno.EIO}


@pytest.mark.fuse
def test_fail_writes_returns_the_errno_and_leaves_other_files_writable(faultfs):
    (faultfs.root / "remote").mkdir()
    faultfs.fail_writes("remote/*.bin")
    with pytest.raises(OSError) as caught:
        with open(faultfs.root / "remote/w.bin", "wb") as f:
            f.write(b"x" * 10000)
    assert caught.value.errno == errno.EIO
    (faultfs.root / "remote/ok.txt").write_bytes(b"ok")
    assert (faultfs.backing / "remote/ok.txt").read_bytes() == b"ok"
    assert faultfs.hits("error", "write")


@pytest.mark.fuse
def test_enospc_on_write_and_on_create(faultfs):
    (faultfs.root / "remote").mkdir()
    existing = make_file(faultfs, "remote/existing", b"")
    faultfs.enospc("remote/*")
    with pytest.raises(OSError) as caught:
        with open(existing, "r+b") as f:
            f.write(b"y" * 4096)
            f.flush()
    assert caught.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as caught:
        open(faultfs.root / "remote/new", "wb").close()
    assert caught.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as caught:
        (faultfs.root / "remote/newdir").mkdir()
    assert caught.value.errno == errno.ENOSPC
    assert not (faultfs.backing / "remote/new").exists()
    (faultfs.root / "elsewhere").write_bytes(b"fine")


@pytest.mark.fuse
def test_stall_blocks_only_the_stalled_op_and_clear_releases_it(faultfs):
    data = b"slow" * 5000
    slow = make_file(faultfs, "remote/slow.bin", data)
    fast = make_file(faultfs, "remote/fast.bin", b"fast")
    faultfs.stall("slow.bin", seconds=300, op="read")
    result = {}
    reader = threading.Thread(target=lambda: result.update(data=slow.read_bytes()), daemon=True)
    reader.start()
    wait_until(lambda: faultfs.hits("stall", "read"), 60, "the stall to fire", interval=0.01)
    # The mount stays usable while one read sleeps (multithreaded loop).
    assert fast.read_bytes() == b"fast"
    assert os.stat(slow).st_size == len(data)
    assert reader.is_alive() and "data" not in result
    faultfs.clear()
    reader.join(timeout=30)
    assert not reader.is_alive()
    assert result["data"] == data


@pytest.mark.fuse
def test_stall_of_a_write_op(faultfs):
    faultfs.stall("LATEST*", seconds=300, op="write")
    writer = threading.Thread(target=lambda: (faultfs.root / "LATEST.tmp").write_bytes(b"step-00000010"),
                              daemon=True)
    writer.start()
    wait_until(lambda: faultfs.hits("stall", "write"), 60, "the write stall to fire", interval=0.01)
    assert writer.is_alive()
    faultfs.clear()
    writer.join(timeout=30)
    assert (faultfs.backing / "LATEST.tmp").read_bytes() == b"step-00000010"


@pytest.mark.fuse
def test_shrink_reports_a_shorter_file_and_reads_stop_there(faultfs):
    data = bytes(range(256)) * 64
    target = make_file(faultfs, "corpus/train/tokens.bin", data)
    assert target.read_bytes() == data
    faultfs.shrink("corpus/train/tokens.bin", 1000)
    assert os.stat(target).st_size == 1000
    assert target.read_bytes() == data[:1000]
    with open(target, "rb") as f:
        f.seek(5000)
        assert f.read(100) == b""
    assert (faultfs.backing / "corpus/train/tokens.bin").stat().st_size == len(data)
    faultfs.clear()
    assert os.stat(target).st_size == len(data)
    assert target.read_bytes() == data


@pytest.mark.fuse
def test_drop_rename_succeeds_and_does_nothing(faultfs):
    latest = make_file(faultfs, "remote/LATEST", b"step-00000001")
    (faultfs.root / "remote/LATEST.tmp").write_bytes(b"step-00000002")
    faultfs.drop_rename("remote/LATEST")
    os.replace(faultfs.root / "remote/LATEST.tmp", latest)  # no error
    assert latest.read_bytes() == b"step-00000001"
    assert (faultfs.root / "remote/LATEST.tmp").read_bytes() == b"step-00000002"
    assert sorted(os.listdir(faultfs.root / "remote")) == ["LATEST", "LATEST.tmp"]
    assert faultfs.hits("drop", "rename")
    faultfs.clear()
    os.replace(faultfs.root / "remote/LATEST.tmp", latest)
    assert latest.read_bytes() == b"step-00000002"


MAPPED_READER = textwrap.dedent("""
    import mmap, sys
    with open(sys.argv[1], "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)  # MAP_SHARED, like np.memmap(mode="r")
    assert m[0] == 7
    print("mapped", flush=True)
    sys.stdin.readline()
    print("value", m[0], flush=True)  # a page fault on the failing file: the kernel cannot fill it -> SIGBUS
""")


@pytest.mark.fuse
def test_a_mapped_file_that_starts_failing_raises_sigbus(faultfs):
    target = make_file(faultfs, "staged/tokens.bin", bytes([7]) * (4 * PAGE))
    child = subprocess.Popen([sys.executable, "-c", MAPPED_READER, str(target)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "mapped"
        faultfs.fail_reads("staged/tokens.bin")
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == -signal.SIGBUS
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.slow
@pytest.mark.fuse
def test_teardown_leaves_no_mount_even_when_busy_or_stalled_or_dead(tmp_path):
    backing, root = faultfs_dirs(tmp_path)
    (backing / "f").write_bytes(b"data")
    with mounted_faultfs(backing, root) as fs:
        held = open(root / "f", "rb")  # keeps the mount busy: the lazy unmount path
        fs.stall("f", seconds=300)
        reader = threading.Thread(target=lambda: (root / "f").read_bytes(), daemon=True)
        reader.start()
        wait_until(lambda: fs.hits("stall"), 60, "the stall to fire", interval=0.01)
    assert not is_mounted(root)
    assert fs.proc.poll() is not None
    reader.join(timeout=30)
    assert not reader.is_alive()
    with pytest.raises(OSError) as caught:  # the filesystem behind the lazily unmounted file is gone
        held.close()
    assert caught.value.errno == errno.ENOTCONN

    with mounted_faultfs(backing, root) as fs:
        fs.proc.kill()  # the filesystem process dies: a dead mount remains until unmounted
        fs.proc.wait()
        with pytest.raises(OSError) as caught:
            os.listdir(root)
        assert caught.value.errno == errno.ENOTCONN
        assert is_mounted(root) and not os.path.ismount(root)
    assert not is_mounted(root)
    assert (backing / "f").read_bytes() == b"data"


@pytest.mark.fuse
def test_direct_io_mount_sends_every_read_to_the_filesystem(tmp_path):
    backing, root = faultfs_dirs(tmp_path)
    data = os.urandom(5 * PAGE)
    (backing / "f").write_bytes(data)
    with mounted_faultfs(backing, root, direct_io=True) as fs, open(root / "f", "rb") as held:
        assert held.read() == data
        fs.stall("f", seconds=0.01)  # a stall that only counts reads
        held.seek(0)
        assert held.read() == data
        assert len(fs.hits("stall", "read")) >= 1
        with pytest.raises(OSError) as caught:  # no page cache: a shared mapping is refused
            mmap.mmap(held.fileno(), 0, prot=mmap.PROT_READ)
        assert caught.value.errno == errno.ENODEV
    assert not is_mounted(root)


# ---- tmpfs ----

def test_small_tmpfs_gives_enospc_on_a_plain_write(small_tmpfs):
    where = small_tmpfs("1m")
    assert os.path.ismount(where)
    with pytest.raises(OSError) as caught:
        with open(where / "big", "wb") as f:
            for _ in range(4):
                f.write(b"\0" * (512 * 1024))
    assert caught.value.errno == errno.ENOSPC
    assert os.statvfs(where).f_bavail == 0


MAPPED_WRITER = textwrap.dedent("""
    import mmap, os, sys
    size = 4 * 1024 * 1024
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, size)  # sparse: fits until its pages are touched
    m = mmap.mmap(fd, size)  # MAP_SHARED
    for offset in range(0, size, mmap.PAGESIZE):
        m[offset] = 1  # past the tmpfs size the kernel cannot allocate the page -> SIGBUS
    print("wrote everything")
""")


def test_small_tmpfs_gives_sigbus_on_a_mapped_write_past_its_size(small_tmpfs):
    where = small_tmpfs(1 << 20)
    child = subprocess.run([sys.executable, "-c", MAPPED_WRITER, str(where / "mapped")], capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == -signal.SIGBUS, child.stdout + child.stderr
    assert "wrote everything" not in child.stdout


# ---- memory cgroup ----

HOG = textwrap.dedent("""
    chunks = []
    for _ in range(64):
        chunks.append(bytearray(8 * 1024 * 1024))  # zero-filled by the allocator: every page is touched
    print("survived", flush=True)
""")


def test_memory_cgroup_oom_kills_a_child_past_its_limit(memory_cgroup):
    group = memory_cgroup(64 << 20)
    assert group.oom_kills() == 0
    child = subprocess.run([sys.executable, "-c", HOG], preexec_fn=group.preexec_fn, capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    assert "survived" not in child.stdout
    assert group.oom_kills() >= 1
    if not group.memsw_limited:  # with a memsw limit this kernel leaves the fail counters at 0
        assert group.failcnt() > 0
    assert group.max_usage() <= group.limit_bytes


def test_memory_cgroup_takes_a_running_pid_and_lets_a_small_child_live(memory_cgroup):
    group = memory_cgroup("256m")
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline(); print('ok')"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        group(child.pid)
        assert child.pid in group.pids()
        out, _ = child.communicate("go\n", timeout=30)
        assert child.returncode == 0 and out.strip() == "ok"
        assert group.oom_kills() == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
