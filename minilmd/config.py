"""The run config: one TOML file read into the schema of config_sections.py (one dataclass per section), every
problem reported at once.

`load_config(path, overrides)` returns a `RunConfig` or raises `ConfigError` listing every problem found in the
values (unknown sections and keys, wrong types, every number not finite or out of its range (RANGES, one table),
a missing budget, the rules between fields). It reads the TOML file and nothing else: what touches the machine or
other runs (paths that cannot be used, a prepared corpus whose vocabulary is not model.vocab_size or whose val
split is empty, a scratch of another run or user, init.from) is minilmd/probes.py's, given as `more_checks`
(`probes.load_checked` does both). Torch-free: the supervisor, the trainer and `minilmd run --check` use it;
daemon/preflight.py adds what only the supervisor's side measures (scratch's room).
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Collection
from dataclasses import fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from minilmd.config_hints import key_hint, meant_keys, top_level_problem
from minilmd.config_sections import (
    LORA_TARGETS,
    PATH_KEYS,
    SECTIONS,
    DataSection,
    Duration,
    EarlyStopSection,
    EvalSection,
    GpuSection,
    InitSection,
    LogSection,
    LoraSection,
    ModelSection,
    RestartSection,
    RunConfig,
    RunSection,
    SyncSection,
    TrainSection,
    toml_key,
)
from minilmd.config_values import TrainTokens, check_values, invalid_fields
from minilmd.perms import own_uid
from minilmd.urls import is_url

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


__all__ = [  # the config's public face: the schema (config_sections.py) with its reading
    "absolute_paths", "apply_sft_defaults", "apply_stage_defaults", "config_from_dict", "ConfigError", "DataSection",
    "DPO_DEFAULTS", "DPO_LORA_DEFAULTS", "Duration", "EarlyStopSection", "EvalSection", "ExtraCheck", "GpuSection",
    "InitSection", "keep_recorded_schedule", "KEPT_ON_RESUME", "load_config", "LogSection", "LORA_TARGETS",
    "given_sets", "LoraSection", "MAX_CONFIG_BYTES", "ModelSection", "parse_overrides", "PATH_KEYS", "recorded_copy",
    "RestartSection", "RunConfig", "RunSection", "SECTIONS", "SFT_DEFAULTS", "SFT_LORA_DEFAULTS", "stage_defaults",
    "SyncSection", "toml_key", "TrainSection",
]


class ConfigError(ValueError):
    """Every problem found in a run config, one per line."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = list(problems)
        self.source = source
        super().__init__(f"{source}: {len(self.problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in self.problems))



SFT_DEFAULTS: dict[str, Any] = {"data.mode": "bucketed", "train.lr": 1e-5, "train.min_lr_ratio": 0.1}
"""What a run on a chat corpus uses where its config does not say otherwise: the SFT seed's method (dynamic padding
with length bucketing) and schedule (lr 1e-5, cosine down to 1e-6; ../shared/seeds, section 7)."""

SFT_LORA_DEFAULTS: dict[str, Any] = {**SFT_DEFAULTS, "train.lr": 1e-4}
"""A LoRA run's on a chat corpus: SFT's, at MiniMind's own LoRA rate (trainer/train_lora.py's --learning_rate 1e-4):
adapters that start at zero move less per step than the full model, which SFT's 1e-5 is for (as for DPO, below)."""

DPO_DEFAULTS: dict[str, Any] = {"train.lr": 1e-5}
"""What a full DPO run (a preference corpus, `prepare --format dpo`) uses where its config does not say otherwise:
a rate that learns in a short run without collapsing the chosen replies' log-probabilities (the sweep of
scripts/dpo_lr_sweep.py, docs/training.md "DPO"); MiniMind's train_dpo.py's 4e-8 stays at ln 2."""

DPO_LORA_DEFAULTS: dict[str, Any] = {"train.lr": 3e-4}
"""A LoRA DPO run's: adapters that start at zero move less per step; at 3e-4 they move about as far as a full run at
its default, its chosen replies' log-probabilities as steady (the same sweep)."""


def stage_defaults(data_format: str, lora: bool) -> tuple[str, dict[str, Any]]:
    """(the stage's name, its defaults) of a run on a corpus of `data_format` ("text", "chat", "dpo"): the one table
    of what a stage changes of the schema's defaults (those of a text corpus, pretraining's)."""
    if data_format == "chat":
        return ("LoRA SFT", SFT_LORA_DEFAULTS) if lora else ("SFT", SFT_DEFAULTS)
    if data_format == "dpo":
        return ("LoRA DPO", DPO_LORA_DEFAULTS) if lora else ("DPO", DPO_DEFAULTS)
    return "pretraining", {}


def apply_stage_defaults(cfg: RunConfig, data_format: str) -> dict[str, Any]:
    """Set the stage's defaults (stage_defaults) on every key the config leaves to its default; returns {key: value}
    of those set. Called by the trainer once it knows the corpus's format, and by the plan (plan/budget.py's
    as_trained), so that both run at the same values."""
    applied = {}
    for key, value in stage_defaults(data_format, cfg.lora.enabled)[1].items():
        if key == "data.mode" and cfg.data.doc_mask:
            continue  # data.doc_mask asks for packed rows (checked with the other values: packed only)
        if not cfg.is_set(key):
            section, name = key.split(".")
            setattr(getattr(cfg, section), name, value)
            applied[key] = value
    return applied


def apply_sft_defaults(cfg: RunConfig) -> dict[str, Any]:
    """apply_stage_defaults on a chat corpus (`bench sft`, which knows it trains SFT)."""
    return apply_stage_defaults(cfg, "chat")


KEPT_ON_RESUME = ("train.lr", "train.min_lr_ratio")
"""The schedule's keys a resumed run keeps from its checkpoint where its config leaves them to a default."""


def keep_recorded_schedule(cfg: RunConfig, recorded: Any) -> dict[str, str]:
    """A resume keeps the rates its run started with: each of KEPT_ON_RESUME that the config leaves to a default
    takes the value the checkpoint's config (`recorded`, its trainer_state.json's "config") holds, so that another
    default (a newer minilmd's, another stage's) never changes a resumed run silently; a value set in the config
    wins. Returns {key: a line} for each key whose value differs from what a fresh start would use."""
    said = {}
    for key in KEPT_ON_RESUME:
        section, name = key.split(".")
        old = (recorded.get(section) or {}).get(name) if isinstance(recorded, dict) else None
        now = getattr(getattr(cfg, section), name)
        if not isinstance(old, (int, float)) or isinstance(old, bool) or old == now:
            continue
        if cfg.is_set(key):
            said[key] = f"{key} = {now!r} as the config sets it (the checkpoint's run used {old!r})"
        else:
            setattr(getattr(cfg, section), name, float(old))
            said[key] = f"{key} = {old!r} kept from the checkpoint (a fresh start would use {now!r})"
    return said


def _section_classes() -> dict[str, type]:
    hints = get_type_hints(RunConfig)
    return {name: hints[name] for name in SECTIONS}


def _type_ok(value: Any, annotation: Any) -> bool:
    if annotation is Any:
        return True
    if get_origin(annotation) is Union:
        return any(_type_ok(value, a) for a in get_args(annotation))
    if get_origin(annotation) is list:
        return isinstance(value, list) and all(_type_ok(v, get_args(annotation)[0]) for v in value)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, annotation)


TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
"""How a wrong type's problem names the type the schema expects (Duration and lists are said by _type_name)."""


def _type_name(annotation: Any) -> str:
    if annotation is Duration:
        return 'a duration (seconds, or a string like "5m")'
    if get_origin(annotation) is list:
        return f"a list of {_type_name(get_args(annotation)[0]).split(' ', 1)[-1]}s"
    return TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def type_problem(key: str, value: Any, annotation: Any) -> str:
    """A value of the wrong type in one line: the field, what it holds, the type expected; and how to write it where
    it is that type in another spelling: a number in quotes ("1000"), an integer written as a float (1000.0)."""
    said = f"{key} = {value!r}: expected {_type_name(annotation)}"
    meant = value
    if isinstance(value, str):
        try:
            meant = tomllib.loads(f"v = {value.strip()}")["v"]
        except (tomllib.TOMLDecodeError, RecursionError):  # `"[[[[..."`: tomllib recurses once per level
            return said
    elif annotation is int and isinstance(value, float) and value.is_integer():
        meant = int(value)
    if meant is value or not _type_ok(meant, annotation):
        return said
    quoted = " (no quotes)" if isinstance(value, str) else ""
    return f"{said}: write {key.split('.')[-1]} = {toml_value(meant)}{quoted}"


def parse_overrides(overrides: list[str] | None) -> dict[str, dict[str, Any]]:
    """["train.micro_batch_size=16", 'data.prepared="/x"'] -> nested dict. Values are TOML literals, or bare
    strings when they do not parse as TOML."""
    nested: dict[str, dict[str, Any]] = {}
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot:
            raise ConfigError([f"override {item!r} is not SECTION.KEY=VALUE"], "--set")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except (tomllib.TOMLDecodeError, RecursionError):  # not a TOML literal (or one nested too deep to parse)
            value = raw
        nested.setdefault(section, {})[name] = value
    return nested


def given_sets(overrides: list[str] | None) -> dict[str, dict[str, Any]]:
    """parse_overrides of a command line's `--set`s, their relative paths made absolute against the working
    directory: a --set is typed in a shell, its relative paths are the shell's. The working directory is asked for
    only when there are --sets (one deleted since is no error otherwise); a supervisor does this once, at start
    (daemon/supervisor.py), so that no relaunch asks again."""
    given = parse_overrides(overrides)
    if given:
        absolute_paths(given, Path.cwd())
    return given


SUPERVISOR_SET_KEYS = ("init.staged", "eval.probe_staged")
"""Keys the supervisor sets in the trainer's config ("Set by the supervisor, not by hand": the verified copies in
scratch), never the user: left out of the keys an unknown key's error lists as known."""

ExtraCheck = Callable[["RunConfig"], list[str]]
"""A further check of a built config (what a launch would hit on this machine: minilmd/probes.py); its problems join
the others, after them."""


def config_from_dict(raw: dict[str, Any], source: str = "config", more_checks: ExtraCheck | None = None,
                     train_tokens_of: TrainTokens | None = None) -> RunConfig:
    """Build and validate a RunConfig; raise ConfigError with every problem at once (those of `more_checks` too,
    each of which runs only where the fields it derives from are usable: config_values.usable, from the refused
    fields recorded here). Only the values are checked here: the paths, the corpus and init.from are
    minilmd/probes.py's, given as `more_checks`."""
    problems: list[str] = unexpanded_problems(raw)
    refused_paths = set(unexpanded_keys(raw))  # what the machine checks derive from them waits (usable)
    classes = _section_classes()
    cfg = RunConfig(source=source)
    explicit, mistyped, tables = set(), set(), set()
    settable = {section: [toml_key(f.name) for f in fields(cls) if f"{section}.{toml_key(f.name)}"
                          not in SUPERVISOR_SET_KEYS] for section, cls in classes.items()}
    for section, body in raw.items():
        if section not in classes:
            problems.append(top_level_problem(section, body, settable))
            continue
        if not isinstance(body, dict):
            problems.append(f"[{section}] must be a table, not {type(body).__name__}")
            continue
        tables.add(section)
        cls = classes[section]
        hints = {toml_key(name): hint for name, hint in get_type_hints(cls).items()}
        attrs = {toml_key(f.name): f.name for f in fields(cls)}
        target = getattr(cfg, section)
        for key, value in body.items():
            if key not in hints:
                hint = key_hint(section, key, settable)
                known = ", ".join(k for k in hints if f"{section}.{k}" not in SUPERVISOR_SET_KEYS)
                problems.append(f"unknown key {section}.{key}" + (f": {hint}" if hint else f" (known: {known})"))
                # the field meant keeps its default: a check derived from it (a missing budget, the corpus against
                # [model]) would judge that default (`[model] vocab = 2000`: "set model.vocab_size = 2000")
                mistyped.update(meant_keys(hint))
                continue
            if not _type_ok(value, hints[key]):
                problems.append(type_problem(f"{section}.{key}", value, hints[key]))
                mistyped.add(f"{section}.{key}")
                continue
            if hints[key] is float and isinstance(value, int):
                value = float(value)
            setattr(target, attrs[key], value)
            explicit.add(f"{section}.{key}")
    cfg._explicit, cfg._tables = frozenset(explicit), frozenset(tables)
    cfg._unusable = frozenset(invalid_fields(cfg, mistyped | refused_paths))
    problems += check_values(cfg, train_tokens_of)
    if more_checks is not None:
        problems += more_checks(cfg)
    if problems:
        raise ConfigError(problems, source)
    return cfg


MAX_CONFIG_BYTES = 1 << 20
"""A run config is a few KB; a bigger file is not one (and is never read whole)."""


def load_config(path: str | os.PathLike, overrides: list[str] | None = None, more_checks: ExtraCheck | None = None,
                train_tokens_of: TrainTokens | None = None, untrusted: bool = False,
                owners: Collection[int] | None = None) -> RunConfig:
    """Read, merge `--set` overrides, validate the values (config_from_dict). Raises ConfigError (every problem) or
    nothing. minilmd/probes.py's load_checked adds the checks of the paths, the corpus and init.from. The file is
    read bounded and never blocks (a FIFO is refused unopened), and TOML nested too deep for the parser is a
    ConfigError; `untrusted` (another run's copy, which another run may have rewritten): no link followed, and it
    must be owned by one of `owners` (this user when None; daemon/views/runarg.py adds the owner of the file named),
    checked before a byte is parsed. A run directory's run.toml is read by minilmd/run_config_copy.py `run_config_of`
    instead (through the directory's descriptor, with state.json's owner rule, then `config_from_bytes`). A config
    the user names is read by minilmd/config_file.py's owner rule (hers or root's, no other user's link or directory
    on the way)."""
    from minilmd.config_file import ConfigRefused, read_own_config
    from minilmd.untrusted import Unreadable, read_bytes

    path = Path(path)
    try:
        if path.is_dir():
            raise ConfigError([f"{path} is a directory, not a TOML file"], str(path))
        if untrusted:
            accepted = tuple(owners) if owners is not None else (own_uid(),)
            data = read_bytes(path, max_bytes=MAX_CONFIG_BYTES, owner=accepted)
        else:
            data = read_own_config(path, MAX_CONFIG_BYTES)
    except ConfigRefused as e:
        raise ConfigError([str(e)], str(path)) from None
    except Unreadable as e:
        if e.os_error is not None:  # there and could not be read now (EIO, EACCES): the caller's to retry or say
            raise e.os_error from None
        problem = f"no such file: {path}" if e.missing else f"{path}: unreadable ({e.why})"
        raise ConfigError([problem], str(path)) from None
    return config_from_bytes(data, path, overrides, more_checks, train_tokens_of)


def config_from_bytes(data: bytes, path: str | os.PathLike, overrides: list[str] | None = None,
                      more_checks: ExtraCheck | None = None, train_tokens_of: TrainTokens | None = None) -> RunConfig:
    """load_config of a config file's bytes, read by the caller (another run's run.toml, read through its run
    directory's descriptor: minilmd/run_config_copy.py `run_config_of`); `path` names it and makes its relative paths
    absolute (its directory's)."""
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError([f"not valid TOML: {e}"], str(path)) from None
    except RecursionError:  # `a = [[[[...` of a file this size: tomllib recurses once per level
        raise ConfigError(["not a run config: its TOML is nested too deep"], str(path)) from None
    absolute_paths(raw, Path(os.path.abspath(path)).parent)
    given = given_sets(overrides)
    for section, values in given.items():
        if isinstance(raw.get(section, {}), dict):
            raw.setdefault(section, {}).update(values)
    return config_from_dict(raw, str(path), more_checks, train_tokens_of)


def absolute_paths(raw: dict[str, Any], base: Path) -> list[str]:
    """Each relative path of PATH_KEYS in `raw` (a TOML document's dict) made absolute against `base`, in place: a
    config's against its own directory, so that `run --check` from one directory, a systemd unit started from /
    and a restart from another agree; returns the keys changed. Values of the wrong type are left to the checks."""
    changed = []
    for key in PATH_KEYS:
        section, name = key.split(".")
        body = raw.get(section)
        value = body.get(name) if isinstance(body, dict) else None
        if isinstance(value, str) and value and not is_url(value) and not os.path.isabs(value) \
                and not unexpanded(value):  # refused as it is (unexpanded_problems), not made a place under base
            body[name] = os.path.abspath(os.path.join(base, value))  # type: ignore[index]
            changed.append(key)
    return changed


def unexpanded(value: str) -> bool:
    """A path value a shell would expand and TOML does not: `~/runs`, `$HOME/runs`, `${SCRATCH}/x`."""
    return value.startswith("~") or "$" in value


def unexpanded_keys(raw: dict[str, Any]) -> dict[str, str]:
    """{key: value} of each path of PATH_KEYS in `raw` (the file's values and the --sets) holding a `~` or a `$VAR`."""
    found = {}
    for key in PATH_KEYS:
        section, name = key.split(".")
        body = raw.get(section)
        value = body.get(name) if isinstance(body, dict) else None
        if isinstance(value, str) and not is_url(value) and unexpanded(value):
            found[key] = value
    return found


def unexpanded_problems(raw: dict[str, Any]) -> list[str]:
    """Each path of unexpanded_keys refused: taken literally it would be a directory named `~` under the config's (a
    later `rm -rf ~` to clean it deletes the home)."""
    problems = []
    for key, value in unexpanded_keys(raw).items():
        example = os.path.expandvars(os.path.expanduser(value))
        example = example if os.path.isabs(example) and not unexpanded(example) else "/home/you/..."
        problems.append(f"{key} = {value!r}: TOML expands neither ~ nor $VAR: write the full path, e.g. {example}")
    return problems


def named_run_dir(data: bytes, path: str | os.PathLike) -> Path | None:
    """run.dir of a config file's bytes even when its other keys have problems (`minilmd status/logs/stop CONFIG`
    of a run whose config is being edited: daemon/views/runarg.py), absolute against the config's directory as
    config_from_bytes makes it; None when the TOML does not parse or names no run.dir."""
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError):
        return None
    absolute_paths(raw, Path(os.path.abspath(path)).parent)
    run = raw.get("run")
    value = run.get("dir") if isinstance(run, dict) else None
    return Path(value) if isinstance(value, str) and os.path.isabs(value) else None


def recorded_copy(path: str | os.PathLike) -> str:
    """The text of the run's copy of its config (run.toml in run.dir, which the trainer and every restart read):
    the file as written when its paths are absolute; else its values with each relative path made absolute against
    the config's directory (absolute_paths), so that the copy, read from run.dir, names the same places."""
    from minilmd.config_file import read_own_config

    text = read_own_config(path, MAX_CONFIG_BYTES).decode("utf-8")  # by the rule the launch read it by
    raw = tomllib.loads(text)
    if not absolute_paths(raw, Path(os.path.abspath(path)).parent):
        return text
    return (f"# {os.path.abspath(path)} as this run started from it, its relative paths made absolute against its "
            f"directory\n" + "".join(f"\n[{section}]\n" + "".join(f"{key} = {toml_value(value)}\n"
                                                                    for key, value in body.items())
                                     for section, body in raw.items()))


def toml_value(value: Any) -> str:
    """A TOML literal of a config value (a string, a bool, a number or a list of them: the schema's types)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")
