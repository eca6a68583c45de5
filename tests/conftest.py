"""Shared test set-up: the corpora, the tokenizer and the undisturbed training runs that many test modules use,
each built once: the first pytest worker to ask builds it under a lock, and every other worker and every later run
of the same code reads it (fixture_cache.py: keyed by the sources that shape it, checked against its digest).

Tests run on CPU, on 2 cores: torch keeps to one thread per process. `make test` runs them on 3 pytest-xdist
workers, so a test never assumes it is alone on the machine: every path, port, cgroup and lock dir is its own
(tmp_path, a free port). The session fixtures are shared by every test of one worker that asks for them: a test
that changes one works on a copy (shutil.copytree), and each fixture checks at the end of the session that nothing
changed it (a changed one is reported as an error of that fixture).

Plain helpers (functions a test calls, also used by the soak script) stay in modules of their own:
trainer_corpus.py (prepared corpora, tiny model configs, run configs, `minilmd train`), in_process.py (`minilmd
train` in the test's own process, its process-wide settings given back), supervisor_helpers.py
(`minilmd run` as a process and its files), reliability_helpers.py (watchers for the reliability tests),
data_helpers.py (JSONL sources and tokenizers for the data tests), chat_helpers.py (chat templates,
conversations and prepared chat corpora), weights_helpers.py (in-process tiny models and
checkpoints), waiting.py (wait_until, without_blocking), faults_fixtures.py (FUSE, tmpfs and memory-cgroup
faults), and one helpers module per topic that several test modules share: sync_helpers.py, lease_helpers.py,
resume_helpers.py, scratch_helpers.py, deploy_helpers.py, init_from_helpers.py, hostile_files_helpers.py,
import_helpers.py, rename_flags.py, base_copy_helpers.py, slurm_helpers.py, held_sync.py, tmpfs_helpers.py;
source_tree.py reads and parses the project's own source once per process for every guard that walks it;
audit_calls.py reads a call under any spelling for the audits of calls, signal_backstop.py is the signal audit's
run-time side (signals_sent_through_procs).
A test module imports no other test module (tests/test_layers.py checks): what two share lives in a helpers module.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest
from xdist.scheduler import LoadGroupScheduling

import signal_backstop  # before any module of the code: it replaces os.kill & co. for them to bind (it checks)
from chat_helpers import (
    chat_bpe,
    chat_tokenizer_dir,
    chatterbot_slice,
    preference_pairs,
    prepared_chat,
    read_conversations,
    write_jsonl,
)
from data_helpers import demo_slice, small_tokenizer
from faults_fixtures import faultfs, memory_cgroup, small_tmpfs  # noqa: F401 - fixtures, shared here
from fixture_cache import as_ordered, built_once, in_order, tree_digest, vocab_of
from minilmd.config import load_config
from minilmd.names import SYSTEM_REGISTRY_ENV
from reliability_helpers import undisturbed_fake_weights
from slurm_cluster import slurm  # noqa: F401 - the local Slurm fixture, shared here
from supervisor_helpers import BASELINE, train_undisturbed, write_config
from trainer_corpus import real_text_prepared

SLOW_S = 2.0
"""A test whose call takes longer than this belongs to the slow tier (`-m slow`; `make test-fast` runs the rest).
The tier must also stay short (about 2 minutes on an idle 2-core machine, 2744 tests), so the heaviest tests under
this bound (about 0.4 s and up, mostly a whole `minilmd` command in a subprocess) are marked slow too; the guards of
the layout (test_layers, test_import_graph, test_names, test_import_budget) stay fast whatever they cost."""


if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # Started in the background of a shell without job control (`nohup ... &`), the suite inherits SIGINT ignored,
    # and so would every command it starts: `logs -f` and the others that a test stops with Ctrl-C (SIGINT) would
    # never stop. Python's own handler here gives the children SIGINT's default, as in a foreground run.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def process_wide_settings_restored():
    """What a command run in-process (typer's CliRunner) sets for its whole process, as it should in a process of
    its own, is given back after each test: the umask (`run`, `train` and `export` add the file permissions
    policy's bits, minilmd/perms.py) and the handlers of the stop signals (`prepare`'s SIGTERM handler). Without
    it, one test's private umask made the next tests' directories unreachable for the second user."""
    umask = os.umask(0o022)
    os.umask(umask)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    os.umask(umask)
    for sig, handler in handlers.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            signal.signal(sig, handler)


@pytest.fixture(autouse=True)
def signals_sent_through_procs():
    """Any os.kill, os.killpg or signal's sending functions the code calls outside minilmd/procs.py fails the test
    (signal_backstop.py: the run-time side of test_one_way_to_signal; tests themselves may signal)."""
    with signal_backstop.senders_watched() as found:
        yield found
    assert not found, "a signal sent outside minilmd/procs.py:\n" + "\n".join(found)


@pytest.fixture(autouse=True)
def fetch_reads_again_without_pause(monkeypatch):
    """A fetch in this process reads a remote checkpoint that does not verify again at once, not after its pauses
    (daemon/jobs/fetch.py READ_AGAIN_AFTER_S: seconds each a test of a damaged checkpoint would wait for nothing);
    a supervisor in a process of its own pauses as in use (tests/test_remote_read_again.py's short read of a moment),
    or as tests/quick_cli.py sets."""
    monkeypatch.setattr("minilmd.daemon.jobs.fetch.READ_AGAIN_AFTER_S", (0.0, 0.0))
    monkeypatch.setattr("minilmd.daemon.jobs.stagingfetch.RELIST_AFTER_S", 0.0)  # its listing's second look too


def in_order(root: Path, paths: list) -> None:
    """Keeps the order a builder returned its files in (tokenizer training and prepare read them in that order)."""
    (root / "order.txt").write_text("\n".join(Path(p).name for p in paths), encoding="utf-8")


def as_ordered(root: Path) -> list[Path]:
    return [root / name for name in (root / "order.txt").read_text(encoding="utf-8").splitlines()]


def vocab_of(corpus: Path) -> int:
    return int(json.loads((corpus / "meta.json").read_text(encoding="utf-8"))["vocab_size"])


def assert_unchanged(what: str, digest: str, *roots: Path) -> None:
    assert tree_digest(*roots) == digest, f"a test changed the shared {what} ({', '.join(map(str, roots))}): " \
                                          "copy a session fixture before changing it"


# --- corpora and the tokenizer -----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def corpus() -> tuple[Path, int]:
    """(prepared corpus directory, vocabulary size): 400 real Chinese reviews under a 512-entry byte-level BPE,
    written directly in the prepared format (trainer_corpus.real_text_prepared). Read-only: copy it to damage it."""
    root = built_once("corpus", lambda out: real_text_prepared(out, n_docs=400, vocab_size=512)) / "corpus"
    made = root, vocab_of(root)
    digest = tree_digest(made[0])
    yield made
    assert_unchanged("corpus", digest, made[0])


@pytest.fixture(scope="session")
def demo_jsonl() -> list[str]:
    """The demo corpus's JSONL source files, 300 documents each (data_helpers.demo_slice): input of `prepare`
    and of tokenizer training. Read-only."""
    root = built_once("demo-jsonl", lambda out: in_order(out, demo_slice(out, 300)))
    paths = [str(p) for p in as_ordered(root)]
    digest = tree_digest(root)
    yield paths
    assert_unchanged("demo JSONL", digest, root)


@pytest.fixture(scope="session")
def tokenizer(demo_jsonl) -> Path:
    """tokenizer.json of a 512-entry byte-level BPE trained on demo_jsonl, MiniMind's special ids 0, 1, 2."""
    path = built_once("tokenizer", lambda out: small_tokenizer(demo_jsonl, out / "tokenizer.json")) / "tokenizer.json"
    digest = tree_digest(path.parent)
    yield path
    assert_unchanged("tokenizer", digest, path.parent)


@pytest.fixture(scope="session")
def chat_jsonl() -> list[Path]:
    """chatterbot-corpus's 467 Chinese dialogs and its first 300 English ones as MiniMind SFT JSONL
    (chat_helpers.chatterbot_slice). Read-only."""
    root = built_once("chat-jsonl", lambda out: in_order(out, chatterbot_slice(out)))
    paths = as_ordered(root)
    digest = tree_digest(root)
    yield paths
    assert_unchanged("chat JSONL", digest, root)


@pytest.fixture(scope="session")
def chat_tokenizer(demo_jsonl, chat_jsonl) -> Path:
    """A tokenizer directory: a 2048-entry byte-level BPE trained on demo_jsonl and chat_jsonl's messages
    (chat_helpers.chat_bpe; MiniMind's special ids) and a tokenizer_config.json holding chat_helpers.TEST_TEMPLATE
    (ChatML turns, MiniMind's empty think block). Read-only."""
    root = built_once("chat-tokenizer", lambda out: chat_tokenizer_dir(
        chat_bpe(demo_jsonl, chat_jsonl, out / "bpe" / "tokenizer.json"), out / "tok"))
    path = root / "tok"
    digest = tree_digest(path)
    yield path
    assert_unchanged("chat tokenizer", digest, path)


@pytest.fixture(scope="session")
def chat_corpus(chat_jsonl, chat_tokenizer) -> tuple[Path, int]:
    """(prepared chat corpus directory, vocabulary size): chat_jsonl prepared with `--format chat` under
    chat_tokenizer, seq_len 128 (conversations cut there), micro-batch 8, val fraction 0.05: 735 + 32
    conversations, median 51 tokens, 48 % PAD when padded to 128 against 0.7 % in length-bucketed micro-batches of 8.
    Read-only: copy it to damage it (chat_helpers.prepared_chat makes one with another seq_len)."""
    root = built_once("chat-corpus", lambda out: prepared_chat(chat_jsonl, chat_tokenizer, out / "corpus")) / "corpus"
    made = root, vocab_of(root)
    digest = tree_digest(root)
    yield made
    assert_unchanged("chat corpus", digest, root)


@pytest.fixture(scope="session")
def chat_corpus_short(chat_jsonl, chat_tokenizer) -> tuple[Path, int]:
    """chat_jsonl prepared as chat_corpus is, at seq_len 32: supervisor_helpers.BASELINE's, for the runs that train
    at it. On chat_corpus (prepared at 128) such a run cuts 80 % of its reply tokens, which run --check and the
    trainer refuse (minilmd/replycut.py). Read-only."""
    root = built_once("chat-corpus-32", lambda out: prepared_chat(chat_jsonl, chat_tokenizer, out / "corpus",
                                                                   seq_len=32)) / "corpus"
    made = root, vocab_of(root)
    digest = tree_digest(root)
    yield made
    assert_unchanged("chat corpus at 32", digest, root)


@pytest.fixture(scope="session")
def dpo_jsonl(chat_jsonl) -> Path:
    """MiniMind DPO lines built from chat_jsonl's real dialogs (chat_helpers.preference_pairs: the real reply
    chosen, another dialog's reply rejected). Read-only."""
    root = built_once("dpo-jsonl", lambda out: write_jsonl(out / "pairs.jsonl",
                                                          preference_pairs(read_conversations(chat_jsonl))))
    digest = tree_digest(root)
    yield root / "pairs.jsonl"
    assert_unchanged("DPO JSONL", digest, root)


@pytest.fixture(scope="session")
def dpo_corpus(dpo_jsonl, chat_tokenizer) -> tuple[Path, int]:
    """(prepared preference corpus, vocabulary size): dpo_jsonl prepared with `--format dpo` under chat_tokenizer,
    seq_len 128, val fraction 0.1. Read-only."""
    root = built_once("dpo-corpus", lambda out: prepared_chat([dpo_jsonl], chat_tokenizer, out / "corpus",
                                                              val_fraction=0.1, data_format="dpo")) / "corpus"
    made = root, vocab_of(root)
    digest = tree_digest(root)
    yield made
    assert_unchanged("DPO corpus", digest, root)


SMALL_DPO_LINES = 160


@pytest.fixture(scope="session")
def small_dpo_corpus(dpo_jsonl, chat_tokenizer) -> tuple[Path, int]:
    """dpo_corpus's first SMALL_DPO_LINES lines of dpo_jsonl prepared the same way (142 + 12 pairs, one vocabulary
    with it): for the DPO runs whose checks do not depend on how many pairs there are (rates, resumes, refusals,
    warnings). Every fresh DPO start computes the reference over all its pairs: a 1-step run on dpo_corpus's 761
    took 5.9 CPU s, on these 3.3. Read-only."""
    def build(out: Path) -> None:
        lines = dpo_jsonl.read_text(encoding="utf-8").splitlines(keepends=True)[:SMALL_DPO_LINES]
        out.mkdir(parents=True)
        (out / "pairs.jsonl").write_text("".join(lines), encoding="utf-8")
        prepared_chat([out / "pairs.jsonl"], chat_tokenizer, out / "corpus", val_fraction=0.1, data_format="dpo")

    root = built_once("small-dpo-corpus", build) / "corpus"
    made = root, vocab_of(root)
    digest = tree_digest(root)
    yield made
    assert_unchanged("small DPO corpus", digest, root)


# --- undisturbed runs: what a disturbed run must end with ------------------------------------------------------------
@dataclass(frozen=True)
class Undisturbed:
    """A run of the real trainer straight through, without a supervisor or a remote: supervisor_helpers'
    write_config with BASELINE and data.mode. Shared by every test that compares final weights with it: read it,
    never write into it."""
    mode: str
    corpus: tuple[Path, int]
    run_dir: Path
    checkpoint: Path
    """The final checkpoint (step BASELINE's max_steps); the one before it is kept beside it."""
    doc_mask: bool = False

    def config_like(self, tmp: Path, name: str, remote: bool = False, **sections) -> Path:
        """A config of this same run under another name (its own run dir and scratch, a remote if asked for);
        sections={"run": {...}} change it further (what a trainer then computes must not depend on them)."""
        body = {"data": run_data(self.mode, self.doc_mask), **{s: dict(kv) for s, kv in BASELINE.items()}}
        for section, values in sections.items():
            body.setdefault(section, {}).update(values)
        return write_config(tmp, self.corpus, name, remote=remote, **body)


def run_data(mode: str, doc_mask: bool) -> dict:
    """The data section of an undisturbed run (doc_mask named only when set: the plain runs' configs as before)."""
    return {"mode": mode, "doc_mask": True} if doc_mask else {"mode": mode}


@pytest.fixture(scope="session")
def undisturbed(corpus, tmp_path_factory, request):
    """undisturbed(mode="packed", doc_mask=False, chat=False) -> Undisturbed: trained the first time a run is asked
    for, then reused; chat=True trains on chat_corpus_short (made only then) instead of corpus."""
    runs: dict[str, tuple[Undisturbed, Path, str]] = {}

    def get(mode: str = "packed", doc_mask: bool = False, chat: bool = False) -> Undisturbed:
        key = mode + ("-doc_mask" if doc_mask else "") + ("-chat" if chat else "")
        if key not in runs:
            on = request.getfixturevalue("chat_corpus_short") if chat else corpus
            tmp = tmp_path_factory.mktemp(f"undisturbed-{key}")
            final = train_undisturbed(tmp, on, data=run_data(mode, doc_mask), **BASELINE)
            run_dir = load_config(tmp / "plain.toml").run_dir
            runs[key] = Undisturbed(mode, on, run_dir, final, doc_mask), tmp, tree_digest(tmp)
        return runs[key][0]

    yield get
    for key, (_, tmp, digest) in runs.items():
        assert_unchanged(f"undisturbed {key} run", digest, tmp)


@pytest.fixture(scope="session")
def fake_undisturbed_weights(corpus, tmp_path_factory) -> int:
    """The fake trainer's final "weights" for supervisor_helpers.write_config's default 30-step run, straight
    through and unsupervised (reliability_helpers.undisturbed_fake_weights)."""
    return undisturbed_fake_weights(write_config(tmp_path_factory.mktemp("fake-undisturbed"), corpus, name="u",
                                                 remote=False))


# --- the registry of runs (`minilmd status --all`) ------------------------------------------------------------------
@pytest.fixture(autouse=True, scope="session")
def private_run_registry(tmp_path_factory):
    """The supervisors tests start register their runs here, not in the tester's ~/.local/state or the machine's
    /var/lib/minilmd (daemon/host/registry.py); subprocesses inherit it through the environment. torchrun's log
    directory (PET_LOG_DIR, its --log-dir) goes here too: left to itself, each torchrun a test starts leaves an
    empty /tmp/torchelastic_* behind (hundreds a CI run)."""
    root = tmp_path_factory.mktemp("registry")
    saved = {k: os.environ.get(k) for k in ("XDG_STATE_HOME", SYSTEM_REGISTRY_ENV, "PET_LOG_DIR")}
    os.environ["XDG_STATE_HOME"] = str(root / "state")
    os.environ[SYSTEM_REGISTRY_ENV] = str(root / "no-system-registry")
    os.environ["PET_LOG_DIR"] = str(root / "torchelastic")
    yield root
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# --- a directory nobody may write into -----------------------------------------------------------------------------
@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nobody may write into: a read-only tmpfs as root (root ignores mode bits), else mode 0500."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o500)
        yield ro
        ro.chmod(0o700)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)]).returncode != 0:
        pytest.skip("needs permission to mount a read-only tmpfs")
    try:
        yield ro
    finally:
        subprocess.run(["umount", str(ro)])


# --- the fast tier stays fast --------------------------------------------------------------------------------------
_unmarked_slow: list[tuple[float, str]] = []


def pytest_runtest_logreport(report):
    if report.when == "call" and report.duration > SLOW_S and not report.keywords.get("slow"):
        _unmarked_slow.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    """Name the tests outside the slow tier whose call took longer than SLOW_S, to be marked slow. A report, not
    a failure: timings on a shared machine are noise."""
    if _unmarked_slow:
        terminalreporter.section(f"tests over {SLOW_S:.0f} s not marked slow")
        for seconds, nodeid in sorted(_unmarked_slow, reverse=True):
            terminalreporter.write_line(f"{seconds:6.2f}s {nodeid}")


# --- the slow tier first, the longest first ---------------------------------------------------------------------
SLOW_DURATIONS = Path(__file__).with_name("slow_durations.txt")
"""Seconds per slow test: the setup, call and teardown lines of pytest's --durations report. Only their order
matters (measured in a whole `make test` on 2 cores, 3 workers, at stop 62). To measure them again:
  make test PYTEST_ARGS="-m slow --durations=0" | grep -E '^ *[0-9.]+s (setup|call|teardown) ' >durations.txt
and move durations.txt here."""
UNMEASURED_S = 1.2
"""What a slow test missing from slow_durations.txt (a new one) counts as: about the median there (1.18 s)."""
DURATION_LINE = re.compile(r"\s*([\d.]+)s (?:setup|call|teardown) +(\S.*)")


def measured_seconds() -> dict[str, float]:
    """Seconds per test id (setup, call and teardown summed) from SLOW_DURATIONS; an xdist_group's suffix (@name,
    added to the ids under --dist loadgroup) dropped. A test missing there counts as UNMEASURED_S, a line naming no
    test any more is ignored."""
    seconds: dict[str, float] = {}
    for line in SLOW_DURATIONS.read_text(encoding="utf-8").splitlines():
        if found := DURATION_LINE.fullmatch(line):
            nodeid = found[2].rstrip()
            if nodeid.rfind("@") > nodeid.rfind("]"):
                nodeid = nodeid[:nodeid.rfind("@")]
            seconds[nodeid] = seconds.get(nodeid, 0.0) + float(found[1])
    return seconds


def pytest_collection_modifyitems(config, items):
    """The tests marked slow run first, the longest first (slow_durations.txt), then the fast ones in collection
    order (a stable sort). `make test` runs pytest-xdist with --dist loadgroup, which hands the tests out in this
    order, a few at a time, to the worker that has finished: the long ones start together at once and the short
    ones fill the gaps at the end. (The default --dist load gave each worker one block of a third of the slow tier
    in collection order at the start, whatever its blocks' lengths.)"""
    seconds = measured_seconds()
    items.sort(key=lambda item: -seconds.get(item.nodeid, UNMEASURED_S) if item.get_closest_marker("slow") else 1)


SAME_WORKER = {"tests/test_gpu_check.py::test_the_dry_run_": "gpu-check-dry-run",
               "tests/test_watch_real.py::": "watch-real-resumed-run",
               "tests/test_best_pointer.py::test_the_next_stage_starts_from_the_best_": "best-pointer-real-run",
               "tests/test_best_pointer.py::test_init_checkpoint_last_takes_the_latest_": "best-pointer-real-run"}
"""Tests (by the start of their id) that --dist loadgroup hands to one worker together: a module fixture is set up
once per worker that runs a test of its module, and test_gpu_check's dry_run costs minutes (test_watch_real's
resumed_run, a real run with a SIGBUS restart, about 9 s on a loaded machine, was set up by each of the 4 workers;
test_best_pointer's finished_early_stopped_run, 4 s, by two). pytest-xdist's own xdist_group mark does nothing under
pytest 9.2 (it renames item._nodeid, which pytest no longer reads)."""


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") == "loadgroup":
        return SameWorkerGroups(config, log)
    return None


class SameWorkerGroups(LoadGroupScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return next((group for start, group in SAME_WORKER.items() if nodeid.startswith(start)), None) or \
            super()._split_scope(nodeid)
