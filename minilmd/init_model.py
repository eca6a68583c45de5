"""init.from's model against the run's [model], said so that the fix can be pasted (user5 #5). [model] is never
inherited from init.from: a stage after a pretraining of a non-default model that leaves [model] out (as the docs'
sft.toml example does) runs the defaults, and was refused as "model.hidden_size: source 64, run 768", 768 being a
default the user never wrote. The refusal now says which of the run's values are defaults and gives the source's
values as the [model] lines to add. `run --check` and the launch (minilmd/probes.py) say it, for a run still
training (its config) and for a checkpoint (init_source.model_problems)."""
from __future__ import annotations

from collections.abc import Callable

from minilmd.config import toml_value
from minilmd.config_sections import weights_config


def model_mismatch(source: dict, run: dict, written: Callable[[str], bool]) -> str:
    """"" when the source's [model] (a config's, or one a checkpoint recorded) makes the run's weights; else "another
    model config: model.KEY: source X, run Y[ (default)], ...; [model] is not inherited ..." with the
    source's values as TOML lines. `written(key)`: whether the run's config sets "model.KEY" (RunConfig.is_set)."""
    source, run = weights_config(source), weights_config(run)
    keys = [k for k in sorted(set(source) | set(run)) if source.get(k) != run.get(k)]
    if not keys:
        return ""
    defaults = {k for k in keys if not written(f"model.{k}")}
    said = ", ".join(f"model.{k}: source {source.get(k)!r}, run {run.get(k)!r}"
                     + (" (default)" if k in defaults else "") for k in keys)
    said += " (default: this config does not set it)" if len(defaults) == 1 else \
        " (default: this config does not set them)" if defaults else ""
    known = [k for k in keys if source.get(k) is not None]
    if not known:
        return f"another model config: {said}"
    lines = "".join(f"\n      {k} = {toml_value(source[k])}" for k in known)
    return (f"another model config: {said}; [model] is not inherited from init.from: set the source's values in "
            f"this config's [model]:\n      [model]{lines}")
