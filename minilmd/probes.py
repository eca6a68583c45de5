"""What a run config names on this machine and in other runs, checked before anything starts: paths that cannot
be used (run.dir, run.scratch, the Prometheus textfile, run.remote) or that another user could redirect (run.dir,
scratch: minilmd/place_rule.py), a scratch of another run or user
(minilmd/scratch.py), a prepared corpus that is not one, whose vocabulary is not model.vocab_size or whose val split
is empty or whose train split holds no micro-batch (rowcount.too_few_rows), TensorBoard's writer not installed for
`[log] tensorboard`, a corpus most of whose replies
train.seq_len cuts away (DPO's pairs, SFT's reply tokens: minilmd/replycut.py), an init.from
that cannot initialise this model (minilmd/init_source.py) or was trained with a tokenizer provably other
than the corpus's (minilmd/init_tokenizer.py). What the run would do that its config may not mean (`run
--check`'s `note:` lines) is minilmd/stage_notes.py's.

minilmd/config.py checks the values alone; `load_checked` and `checked_from_dict` are its loaders with these checks
after the values' (one ConfigError with every problem) and a missing budget's arithmetic over the corpus's train
tokens. The trainer (`minilmd train`), `minilmd run --check` and the launch (daemon/preflight.py) load through
them. Shared storage (NFS) is probed in a thread for SHARED_STORAGE_PROBE_S at most (minilmd/bounded.py); a
mistyped path is told from a share gone by minilmd/path_checks.py. Torch-free.
"""
from __future__ import annotations

import copy
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from minilmd import init_stall, init_tokenizer, scratch
from minilmd.bounded import SHARED_STORAGE_PROBE_S as SHARED_STORAGE_PROBE_S
from minilmd.bounded import Raised, Stalled, shared_storage_check
from minilmd.bounded import bounded_probe as bounded_probe
from minilmd.checkpoint_dirs import list_checkpoints, local_checkpoint_steps
from minilmd.config import ExtraCheck, RunConfig, apply_stage_defaults, config_from_dict, load_config
from minilmd.config_values import early_stop_metric_problem, usable
from minilmd.corpus_meta import corpus_train_tokens, data_format_of, meta_value, read_corpus_meta
from minilmd.dirfd import run_dir_problem
from minilmd.init_model import model_mismatch
from minilmd.init_source import (
    InitSourceError,
    InitSourceUnreachable,
    Predecessor,
    adapter_source,
    model_problems,
    predecessor,
    predecessor_outcome,
    resolve,
    source_state,
)
from minilmd.names import (
    CORPUS_META,
)
from minilmd.path_checks import (
    check_writable,
    corpus_without_copy,
    has_staged_copy,
    has_started,
    launch_scratch,
    launch_staged_from,
    probe_problems,
    remote_problems,
    textfile_problems,
)
from minilmd.raw_corpus import dir_prepare_hint, prepare_hint
from minilmd.reply_check import replies_verdict
from minilmd.rowcount import kind_of_rows, too_few_rows
from minilmd.shared_place import Place, gone_or_typo, look, same_source
from minilmd.supervision import supervision
from minilmd.urls import chain_over_local, chain_refused, is_url, local_remote_root, protocol_of


def _with_paths(more_checks: ExtraCheck | None, waits: list[str] | None = None, count_replies: bool = True
                ) -> ExtraCheck:
    """path_problems, then `more_checks`' (the order of the one ConfigError)."""
    return lambda cfg: path_problems(cfg, waits, count_replies) + (more_checks(cfg) if more_checks else [])


def load_checked(path: str | os.PathLike, overrides: list[str] | None = None,
                 more_checks: ExtraCheck | None = None, waits: list[str] | None = None,
                 count_replies: bool = True) -> RunConfig:
    """load_config, then path_problems and `more_checks`: every problem in one ConfigError. With `waits` (the
    supervisor's check: it waits), an init.from that cannot be reached now, and the corpus of a run that has
    started before gone with its share, are no problem but a line there. `count_replies` False: the trainer's,
    which counts the replies train.seq_len cuts exactly at its start, not by run --check's sample."""
    return load_config(path, overrides, _with_paths(more_checks, waits, count_replies),
                       train_tokens_of=corpus_train_tokens)


def checked_from_dict(raw: dict[str, Any], source: str = "config", more_checks: ExtraCheck | None = None) -> RunConfig:
    """config_from_dict, then path_problems and `more_checks`: every problem in one ConfigError."""
    return config_from_dict(raw, source, _with_paths(more_checks), train_tokens_of=corpus_train_tokens)


def path_problems(cfg: RunConfig, waits: list[str] | None = None, count_replies: bool = True) -> list[str]:
    """What the config names on this machine and cannot be used, in the config's order: run.dir (and whether another
    user could redirect it: the launch and `minilmd train` check it here, before anything is made), scratch (and whose
    it is), the prepared corpus, the Prometheus textfile, init.from, the probe corpus, the remote. `waits`: see
    load_checked. Each look runs where the fields it reads are usable (config_values.usable), whatever another
    field holds: a train.max_steps of the wrong type hides no missing corpus."""
    p: list[str] = []
    if cfg.run.dir and usable(cfg, "run.dir"):
        p += check_writable("run.dir", Path(cfg.run.dir))
        p += [why] if (why := run_dir_problem(cfg.run.dir)) else []  # no other user may redirect its files
    if (cfg.run.name or cfg.run.scratch) and usable(cfg, "run.name", "run.scratch", "run.dir") \
            and launch_scratch(cfg) is not None:  # not a root another user took
        p += check_writable("run.scratch", cfg.scratch_dir)
        if cfg.run.dir:
            p += scratch.problems(cfg.scratch_dir, cfg.run_dir, cfg.scratch_is_default)
    if cfg.data.prepared and usable(cfg, "data.prepared", "run.dir", "run.scratch", "run.name"):
        if is_url(cfg.data.prepared):
            p += _check_protocol("data.prepared", cfg.data.prepared)
        else:
            p += _corpus_problems(cfg, waits, count_replies)
    if cfg.log.prometheus_textfile and usable(cfg, "log.prometheus_textfile"):
        p += textfile_problems(cfg.log.prometheus_textfile)
    if cfg.log.tensorboard:
        p += tensorboard_problems()
    if cfg.init.from_ and not cfg.init.staged and usable(cfg, *INIT_READS):  # staged: the supervisor verified it
        p += _init_problems(cfg, waits)
    if cfg.eval.probe and not cfg.eval.probe_staged and usable(cfg, "eval.probe", "run.dir"):  # staged: as init
        p += probe_problems(cfg, waits)
    if cfg.run.remote and usable(cfg, "run.remote", "run.dir"):
        unknown = _check_protocol("run.remote", cfg.run.remote) if is_url(cfg.run.remote) else []
        root = local_remote_root(cfg.run.remote)  # a file:// or local:// remote is the local path the sync writes
        p += unknown
        if not unknown and root is not None and supervision() is None:  # not a supervised trainer's
            p += shared_storage_check(remote_problems, root, has_started(cfg), waits)
    return p


TENSORBOARD_INSTALL_HINT = "pip install 'minilmd[tensorboard]'  (or: pip install tensorboard)"


def tensorboard_problems() -> list[str]:
    """`[log] tensorboard = true` where the `tensorboard` package, which torch.utils.tensorboard's writer needs, is not
    installed in this Python: said by `run --check` and the launch, before the GPU wait (the trainer's own import,
    trainer/loop/tensorboard.py `tee`, ends the run there too, exit 2, but only once it has started). Looked up,
    not imported: torch-free."""
    try:
        if importlib.util.find_spec("tensorboard") is not None:
            return []
    except (ImportError, ValueError):  # a broken install: the trainer's import says what it is
        pass
    return [f"log.tensorboard = true, but the tensorboard package is not installed in this Python ({sys.executable}): "
            f"{TENSORBOARD_INSTALL_HINT}, or set log.tensorboard = false"]


def _corpus_problems(cfg: RunConfig, waits: list[str] | None, count_replies: bool = True) -> list[str]:
    """_check_prepared_dir on shared storage, then (`count_replies`) the replies train.seq_len cuts, in a probe of their
    own (reply_check.replies_verdict: a slow count never hides the corpus's other problems). A corpus that is not there
    at all, or an empty directory, is a typo at a first launch, but its share gone or not mounted (an NFS outage, a
    mount not back yet after a reboot) at the restart of a run that has started before (its state.json is there): with
    `waits`, no problem but a line there, since staging trains from the verified copy in scratch or waits for the share
    (daemon/jobs/staging.py), as at any other restart. Unless it is a typo: a data.prepared other than the one the
    staged copy's record names (minilmd/shared_place.py staged_from; no record is no evidence) that is not there while
    the directory above it holds other entries (shared_place.gone_or_typo): refused, as at a first launch, never trained
    from the old copy nor waited for."""
    answered, found, why = bounded_probe(_check_prepared_dir, cfg, says_why=True)
    if not answered:
        return [f"data.prepared = {cfg.data.prepared!r}: cannot be checked: {why}"] if isinstance(why, Raised) else []
    problems, absent, meta = found
    if count_replies and meta is not None and usable(cfg, *ROWS_READ) and (cut := replies_verdict(cfg, meta)[0]):
        problems = [*problems, f"data.prepared = {cfg.data.prepared!r}: {cut}"]
    if waits is not None and meta is not None:
        waits.extend(_cut_short_waits(cfg.data.prepared, meta))
    if not (absent and waits is not None and has_started(cfg)):
        return problems
    prepared, copied = cfg.data.prepared, launch_staged_from(cfg)
    if not has_staged_copy(cfg):  # scratch removed at `done`, emptied by a reboot: nothing to train from
        return corpus_without_copy(cfg, absent, waits)
    # Only a record of another source says data.prepared changed: none (a reboot emptied scratch, a copy staged
    # before the record existed) is no evidence of a typo, and a share gone at a restart is waited for.
    if copied is not None and not same_source(copied, prepared) and \
            (typo := bounded_probe(gone_or_typo, prepared)[1]):
        return [f"data.prepared = {prepared!r}: data.prepared changed and is not there ({typo}); this run staged "
                f"{copied!r} before: a typo?"]
    then = "trains from the verified copy in scratch, or waits for the share" if copied is None or \
        same_source(copied, prepared) else "waits for the share (the copy in scratch is of another corpus)"
    waits.append(f"data.prepared = {prepared!r} {absent}: this run has started before, so it {then} (`minilmd "
                 f"status`: \"corpus source unreachable since ..., retrying\")")
    return []


def corpus_out_of_reach(cfg: RunConfig) -> str:
    """How the run's corpus source cannot be reached now ("is not there now ...", "is an empty directory now ...",
    "did not answer ..."), "" when it can, or when it is a URL (not probed here). Asked before a final failure
    gives the staged copy back (daemon/supervisor.py): with its share gone, that copy is the only one within reach."""
    if not cfg.data.prepared or is_url(cfg.data.prepared):
        return ""
    answered, found, why = bounded_probe(_check_prepared_dir, cfg, says_why=True)
    return found[1] if answered else why


def _cut_short_waits(prepared: str, meta: dict) -> list[str]:
    """`run --check`'s waits for the corpus files shorter than meta.json lists, or missing (shorter_than_listed, in a
    bounded probe), each in the words of what staging then does."""
    missing, short = bounded_probe(shorter_than_listed, prepared, meta)[1] or ("", "")
    said = []
    if short:
        said.append(f"data.prepared = {prepared!r}: {short}: a copy cut short? staging copies it again and again, "
                    f"then gives up (exit 79): prepare it again, or copy it again from where it was prepared (a share "
                    f"that shrank for a moment is read again, so this is no refusal)")
    if missing:  # staging's "source unreachable"
        said.append(f"data.prepared = {prepared!r}: {missing}: a copy cut short, or still under way? staging waits "
                    f"for it, retried with backoff for as long as it takes (status shows the wait): copy it again "
                    f"from where it was prepared, or prepare it again")
    return said


def shorter_than_listed(prepared: str, meta: dict) -> tuple[str, str]:
    """(The files of a prepared corpus that meta.json lists and that are missing, those shorter than it lists), in
    words, by an lstat each, never a read: "" where none is (a longer one is an `prepare --append` under way, read
    to its listed size). Staging treats them apart: a short one is copied 20 times over a minute, then the run gives
    up (a new user's truncated copy); a missing one is waited for, as a share's outage (a new user's partial rsync
    waited while --check said it would give up). Names as meta.json lists them, within the corpus: one naming ".."
    or an absolute path is left to the staging's verification."""
    files = meta.get("files")
    if not isinstance(files, dict):
        return "", ""
    short, missing = [], []
    for name, entry in files.items():
        size = entry.get("size") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not isinstance(size, int) or name.startswith("/") or ".." in name.split("/"):
            continue
        try:
            have = os.lstat(Path(prepared) / name).st_size
        except FileNotFoundError:
            missing.append(f"{name} is missing")
            continue
        except OSError:
            continue  # not looked at now: the staging's to judge
        if have < size:
            short.append(f"{name} holds {have:,} bytes, {CORPUS_META} lists {size:,}")
    return _first_three(missing), _first_three(short)


def _first_three(said: list[str]) -> str:
    return "; ".join(said[:3]) + (f" and {len(said) - 3} more" if len(said) > 3 else "")


ROWS_READ = ("data", "train.seq_len", "train.micro_batch_size", "lora.rank")
"""What a corpus's rows as trained are counted from (too few for a micro-batch, the replies seq_len cuts): the data
mode, the row length, the stage defaults (which a LoRA run's differ in)."""
INIT_READS = ("init", "model", "lora", "data.prepared", "run.dir", "run.scratch", "run.name", "run.remote")
"""What the checks of init.from read: its place, the model it must hold, the corpus's tokenizer, whether the run
has a checkpoint already (then it never reads init.from again)."""


def _check_prepared_dir(cfg: RunConfig) -> tuple[list[str], str, dict | None]:
    """(What is wrong with the corpus, how it is absent: "" when it is there, its meta.json: None when not read.) The
    corpus is a prepared one, and what the trainer would refuse in it after staging is said now: a vocabulary other than
    model.vocab_size (a config error: the config does not match the data), an empty val split. (Ids beyond its own
    vocabulary are the corpus's fault, a data error, found when the trainer opens it.) Absent: not there at all (its
    share gone), or an empty directory (a mount point whose share is not mounted reads as its empty stub), or one that
    cannot be listed now (minilmd/shared_place.py decides, as staging does); a directory holding other files but no
    meta.json is there, and not a prepared corpus. One that cannot be listed is no problem here (a mount that fails is
    not a config error: staging waits for it), as a probe that does not answer."""
    prepared = cfg.data.prepared
    found = look(prepared, CORPUS_META)
    absent = f"is {found.what} now ({found.hint})" if found.outage else ""
    if found.place is Place.GONE:
        return [f"data.prepared = {prepared!r}: no such directory (run `minilmd prepare` first)"], absent, None
    if found.place is Place.EMPTY:
        return [f"data.prepared = {prepared!r}: an empty directory (its share not mounted?); run `minilmd "
                f"prepare` first"], absent, None
    if found.place is Place.UNREADABLE:
        return [], absent, None
    if found.place is Place.NOT_A_DIRECTORY:  # a raw corpus given as the prepared one: the command to run said
        hint = prepare_hint(prepared, cfg.train.seq_len)
        return [f"data.prepared = {prepared!r}: {found}; not an output of `minilmd prepare`"
                f"{hint and '; ' + hint}"], "", None
    if found.place is Place.LACKS or not (Path(prepared) / CORPUS_META).is_file():
        hint = dir_prepare_hint(prepared, cfg.train.seq_len)  # a directory of raw JSON lines: the command said
        return [f"data.prepared = {prepared!r}: no {CORPUS_META} there; not an output of `minilmd prepare`"
                f"{hint and '; ' + hint}"], "", None
    read = read_corpus_meta(prepared)
    meta = read or {}
    p = []
    vocab = meta.get("vocab_size")
    if isinstance(vocab, int) and vocab != cfg.model.vocab_size and usable(cfg, "model.vocab_size"):
        p.append(f"model.vocab_size = {cfg.model.vocab_size} but the corpus {prepared} was tokenized with a "
                 f"vocabulary of {vocab} (its {CORPUS_META}): set model.vocab_size = {vocab}, or prepare the corpus "
                 f"with the tokenizer this model is for")
    unread = read is None  # its format unknown: the trainer, which opens the corpus, says it
    if not unread and usable(cfg, "early_stop.metric") and \
            (metric_problem := early_stop_metric_problem(cfg, data_format_of(meta))):
        p.append(metric_problem)
    val_tokens, val_docs = meta_value(meta, "splits", "val", "tokens"), meta_value(meta, "splits", "val", "documents")
    if isinstance(val_tokens, int) and (val_tokens < 2 or val_docs == 0):
        fraction = meta_value(meta, "split_rule", "val_fraction")
        p.append(f"data.prepared = {prepared!r}: its val split is empty ({val_docs} documents, {val_tokens} tokens), "
                 f"so there is no validation loss: prepare it again with a larger --val-fraction"
                 + (f" (it was {fraction})" if fraction is not None else ""))
    if not unread and usable(cfg, *ROWS_READ) and (too_few := _too_few_rows(cfg, meta)):
        p.append(f"data.prepared = {prepared!r}: {too_few}")
    return p, "", read


def _too_few_rows(cfg: RunConfig, meta: dict) -> str:
    """rowcount.too_few_rows (the samplers' refusal, exit 65 from the trainer) of the run as trained (its corpus's
    stage defaults applied: an SFT run's rows are bucketed) on the train split meta.json counts: no packed window,
    fewer documents, conversations or pairs than one bucket of train.micro_batch_size. "" when it holds a
    micro-batch, or meta.json does not count the split."""
    documents, tokens = (meta_value(meta, "splits", "train", key) for key in ("documents", "tokens"))
    data_format = data_format_of(meta)
    trained = copy.deepcopy(cfg)
    apply_stage_defaults(trained, data_format)
    chat = data_format == "chat"
    kind = "pairs" if data_format == "dpo" else kind_of_rows(trained.data.mode, trained.data.doc_mask, chat)
    if not isinstance(tokens, int) or not kind or (kind != "windows" and not isinstance(documents, int)):
        return ""
    unit = "pairs" if kind == "pairs" else "conversations" if chat else "documents"
    items = (documents or 0) // 2 if kind == "pairs" else documents or 0
    return too_few_rows(kind, items=items, tokens=tokens, seq_len=trained.train.seq_len,
                        micro_batch_size=trained.train.micro_batch_size, unit=unit)


def _init_problems(cfg: RunConfig, waits: list[str] | None) -> list[str]:
    """_check_init on shared storage. A source that cannot be reached now (minilmd.init_source.resolve decides:
    InitSourceUnreachable), or that does not answer: with `waits`, no problem, a line there (the supervisor waits
    for it in staging, as at a restart); without, the problem it is to a reader that cannot wait (a stall is left
    to the trainer's own read, as before). At a first launch (no state.json yet), a path that is not there while
    the directory above it holds other entries (minilmd/shared_place.py gone_or_typo) is a typo, refused as a
    missing data.prepared is, not waited for without end."""
    on_slow = None if waits is None else init_stall.slow_look(  # said as soon as slow (the launch, --check)
        cfg.init.from_, "the launch's check", lambda line: print(f"minilmd run: {line}", flush=True))
    answered, found, why = bounded_probe(_check_init, cfg, says_why=True, on_slow=on_slow)
    if not isinstance(why, Stalled):
        init_stall.answered(cfg.init.from_)
    if isinstance(why, Raised):  # it answered, with an error: a refusal, never a stall to wait for (audit 8 F4)
        return [f"init.from = {cfg.init.from_!r}: cannot be checked: {why}"]
    problems, unreachable = found if answered else ([], why)
    if unreachable is None:
        return problems
    if waits is None:
        return problems + ([f"init.from = {cfg.init.from_!r}: {unreachable}"] if answered else [])
    if answered and not has_started(cfg) and (typo := bounded_probe(gone_or_typo, cfg.init.from_)[1]):
        return problems + [f"init.from = {cfg.init.from_!r}: {unreachable} ({typo}): a typo?"]
    waits.append(f"init.from = {cfg.init.from_!r} cannot be reached now ({unreachable}): the run waits for it, "
                 f"retrying with backoff (`minilmd status`: \"init source unreachable since ..., retrying\")")
    return problems


def _check_init(cfg: RunConfig) -> tuple[list[str], str | None]:
    """init.from can be used and holds this run's model config; not checked once the run has a checkpoint (in
    scratch or on a local remote): that run resumes and never reads init.from again. A supervised trainer looks at
    scratch only (it never touches the remote; staging has fetched the remote's newest checkpoint into scratch).
    (problems, why it cannot be reached now or None)."""
    if has_checkpoint(cfg):
        return [], None
    try:
        pred = predecessor(cfg.init.from_)
        if pred is not None and (loop := _waits_for_itself(cfg, pred)):
            return [f"init.from = {cfg.init.from_!r}: {loop}; name the run it starts from (the earlier stage's "
                    f"config or run directory), or leave init.from out to start from the seeded init"], None
        if pred is not None and predecessor_outcome(pred)[0] == "waiting":  # the supervisor waits for it
            if pred.lora is not None:  # its config says what its final checkpoint will hold: adapters
                from minilmd.checkpoint_contents import lora_text  # here: numpy, which the start never loads

                lora = adapter_source(lora_text(pred.lora))
                return [f"init.from = {cfg.init.from_!r}: run {pred.name} is {lora}"], None
            mismatch = model_mismatch(pred.model, cfg.model_dict(), cfg.is_set)  # its final checkpoint's: then
            return [f"init.from = {cfg.init.from_!r}: run {pred.name} trains {mismatch}"] if mismatch else [], None
        problems = [f"init.from = {cfg.init.from_!r}: {p}" for p in model_problems(cfg.init.from_, cfg.model_dict(),
                                                                                       cfg.init.checkpoint, cfg.is_set)]
        return problems + _tokenizer_problems(cfg), None
    except InitSourceUnreachable as e:
        return [], str(e)
    except InitSourceError as e:
        return [f"init.from = {cfg.init.from_!r}: {e}"], None


def _waits_for_itself(cfg: RunConfig, pred: Predecessor) -> str:
    """Why the stage would wait for ever ("" when it would not): init.from names this run itself, or a run whose own
    init.from names this run back (each waiting for the other to finish). Before, `--check` said it waits, and the
    launch waited in waiting_init with nothing to end it (a new user's copy-paste slip)."""
    here = os.path.realpath(cfg.run_dir)
    if os.path.realpath(pred.run_dir) == here:
        return (f"names this run itself (run {pred.name}, run.dir {cfg.run_dir}): it would wait for its own final "
                f"checkpoint forever")
    try:
        back = predecessor(pred.init_from) if pred.init_from else None
    except InitSourceError:  # its own init.from is its problem, said by its own check
        return ""
    if back is not None and os.path.realpath(back.run_dir) == here:
        return (f"run {pred.name} starts from this run in turn (its init.from = {pred.init_from!r}): each would wait "
                f"for the other to finish, forever")
    return ""


def _tokenizer_problems(cfg: RunConfig) -> list[str]:
    """init.from's checkpoint trained with a tokenizer that provably differs from the one the local corpus was
    prepared with (minilmd/init_tokenizer.py mismatch: another vocabulary size, or ids that stand for other text):
    refused, both named. A .pth, or a corpus behind a URL or unread: nothing proven here."""
    if not cfg.data.prepared or is_url(cfg.data.prepared):
        return []
    try:
        meta = read_corpus_meta(cfg.data.prepared)
        source = resolve(cfg.init.from_, cfg.init.checkpoint)
        state = source_state(source) if meta is not None and source.kind == "checkpoint" else None
    except (ValueError, OSError):  # said by model_problems, as a problem or a wait
        return []
    refused = state and init_tokenizer.mismatch(cfg.init.from_, cfg.data.prepared, source, state, meta or {})
    return [refused] if refused else []


def scratch_checkpoints(cfg: RunConfig) -> list[int]:
    """The checkpoint steps in the scratch the launch will train in (path_checks.launch_scratch): none where another
    user took the default scratch root. The one answer of run --check's and the launch's checks (has_checkpoint,
    daemon/jobs/resumefrom.py find, daemon/jobs/remotewait.py check_line): before, only `find` knew it, and a
    checkpoint planted there passed init.from unchecked (review2 F2)."""
    return local_checkpoint_steps(cfg.checkpoint_dir) if launch_scratch(cfg) is not None else []


def has_checkpoint(cfg: RunConfig) -> bool:
    """The run has a checkpoint of its own (in scratch, or on a local remote outside a supervised trainer, which
    never touches the remote): it resumes and never reads init.from again."""
    if scratch_checkpoints(cfg):
        return True
    remote = local_remote_root(cfg.run.remote)  # a path, file://, local:// (the one answer)
    return bool(remote and supervision() is None and list_checkpoints(Path(remote)))


def _check_protocol(name: str, url: str) -> list[str]:
    import fsspec  # light; only when a URL is configured

    if (inner := chain_over_local(url)) is not None:
        return [f"{name} = {chain_refused(url, inner)}"]
    protocol = protocol_of(url)
    if protocol not in fsspec.available_protocols():
        return [f"{name} = {url!r}: unknown protocol {protocol!r} (fsspec knows: file, memory, sftp, s3, ...)"]
    return []
