"""`corpus report --params/--config`: a model against a corpus: its parameters, Chinchilla's optimum, and the epochs
its budget means, the rows counted by the trainer's own rules (budget.py). Added to the report of
minilmd/corpus/analysis/report.py by the command (the analysis sits below the plan and never imports it)."""
from __future__ import annotations

from minilmd.corpus.analysis.report import CHINCHILLA_TOKENS_PER_PARAM
from minilmd.plan.budget import as_trained, planned
from minilmd.plan.trainer_state import Trained, scratch_trained


def report_model(r: dict, *, params: int | None, config: str | None, budget_tokens: int | None) -> dict:
    """The "model" section of report `r` (a dict of report()): its train split as the corpus's meta.json says it,
    or the whole corpus before a split."""
    if "splits" in r:
        meta = {"data_format": r.get("data_format", "text"), "splits": r["splits"]}
    else:
        meta = {"splits": {"train": {"documents": r["documents"], "tokens": r.get("train_tokens")}}}
    prepared = r["corpus"] if r.get("kind") == "prepared" else None
    return model_budget(r.get("train_tokens"), params=params, config=config, budget_tokens=budget_tokens, meta=meta,
                        prepared=prepared)


def model_budget(train_tokens: int | None, *, params: int | None, config: str | None,
                 budget_tokens: int | None, meta: dict | None = None, prepared: str | None = None) -> dict:
    """Parameters (from --params, or counted from the config's model as its checkpoint stores it: the head tied
    to the embeddings counted once), Chinchilla's optimum, this corpus's tokens per parameter, and the epochs
    over train that the budget (--budget-tokens, or the config's: config_budget, after what the newest checkpoint
    in the run's scratch trained, trainer_state.scratch_trained) means."""
    budget: dict = {}
    if config:
        from minilmd.config import load_config
        from minilmd.corpus_meta import corpus_train_tokens
        from minilmd.model_shapes import expected_state_shapes, parameter_count

        cfg = load_config(config, train_tokens_of=corpus_train_tokens)
        if not params:
            params = parameter_count(expected_state_shapes(cfg.model))
        if budget_tokens is None:
            budget = config_budget(cfg, meta or {}, train_tokens, prepared, scratch_trained(cfg))
            budget_tokens = budget.pop("budget_tokens", None)
    assert params
    out: dict = {"parameters": int(params), "chinchilla_tokens": CHINCHILLA_TOKENS_PER_PARAM * int(params)}
    if train_tokens:
        out["tokens_per_parameter"] = train_tokens / params
        out["of_chinchilla"] = train_tokens / out["chinchilla_tokens"]
    if budget_tokens:
        out["budget_tokens"] = int(budget_tokens)
        if train_tokens:
            out["epochs"] = budget_tokens / train_tokens
        out.update(budget)
    return out


def config_budget(cfg, meta: dict, train_tokens: int | None, prepared: str | None = None,
                  done: Trained | None = None) -> dict:
    """The rows the config's budget trains on, counted as the trainer will (minilmd/plan/budget.py: the SFT
    defaults first, so a chat run is bucketed; whichever of max_steps, max_tokens, max_epochs ends first), and
    the tokens they hold: a packed window is seq_len tokens of the stream; any other row holds whole documents
    (one, or whole conversations packed), train's tokens per document on average, so its budget is its epochs
    (rows / rows of an epoch) times train's tokens. `done`: what a checkpoint the run resumes from trained
    (planned's, the trainer's rule: after a batch change the rows are its rows plus the rest at today's batch). {}
    when it cannot be told."""
    plan = planned(cfg, meta, prepared, done)
    if plan is None:
        return {}
    if plan.epoch.kind == "windows" if plan.epoch else as_trained(cfg, meta).data.mode == "packed":
        return {"budget_tokens": plan.positions, "rows": plan.rows, "row_unit": "windows"}
    if plan.epoch is None or not plan.epochs or not train_tokens:
        return {}
    return {"budget_tokens": round(plan.epochs * train_tokens), "epochs": plan.epochs, "rows": plan.rows,
            "rows_per_epoch": plan.epoch.rows, "row_holds": plan.epoch.row_holds(), "samples": plan.samples,
            "unit": plan.epoch.unit}
