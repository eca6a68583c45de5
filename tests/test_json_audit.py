"""Every JSON parse outside minilmd/untrusted.py, reviewed (house8 item 4: a manifest parsed by path with json.loads
and read again for a comparison, trainer_state.json loaded by path after its hash was checked on other bytes, a
second safetensors header parser with no bound, two copies of untrusted.loads).

untrusted.loads is the one parse of bytes another user, run or machine may have written: UTF-8, a depth bound before
json.loads could recurse, the type checked, one exception (loads_any: the same, for a reader that shows json's own
words). The audit walks source_tree.audited_files() (the code and the scripts) and counts, by function, each use of
json.load or json.loads under any spelling (tests/audit_calls.py: `import json as j`, `from json import loads as
l`, `ld = json.loads`, getattr(json, "loads")), called or only named. Every one outside untrusted.py must be in
REVIEWED with exactly that count, under the reason its bytes are not another's ("private": this process's own, or
files a script made itself); a new one, one more or one fewer, or a review whose call is gone, fails: parse through
untrusted.loads, or review it here.
"""
from __future__ import annotations

import ast
from collections import Counter

import audit_calls
import audit_sites

THE_ONE = "minilmd/untrusted.py"
PARSES = {"json.load", "json.loads"}
SCRIPT_OWN = ("a device check's or a comparison script's own output (its metrics, its events, a corpus or meta.json "
              "it made in its own work directory), run by hand by the user on her own machine")

REVIEWED: dict[str, tuple[str, str, dict[tuple[str, str], int]]] = {
    "minilmd/corpus/prepare/append.py": ("private", "a deep copy of a dict of this process's (json.dumps then loads)",
                                         {("_new_meta", "json.loads"): 1}),
    "minilmd/corpus/demo_text.py": ("private", "the demo corpus's JSONL, which the demo wrote itself a moment ago",
                                    {("source_texts", "json.loads"): 1}),
    "minilmd/corpus/bench/append.py": ("private", "the benchmark's pool corpus, written by it in its own scratch",
                                       {("generate", "json.loads"): 1}),
    "minilmd/corpus/bench/prepare.py": ("private", "the meta.json the benchmark's own prepare wrote in its scratch",
                                        {("run_prepare", "json.loads"): 1}),
    "scripts/gpu-check": ("private", SCRIPT_OWN + "; a part's result line, which gpu-check's own part printed", {
        ("read_result", "json.loads"): 1, ("part_corpus", "json.loads"): 1}),
    "scripts/gpu_check_sidebyside.py": ("private", SCRIPT_OWN, {("mean_real_tokens", "json.loads"): 1}),
    "scripts/gpu_check_dpo.py": ("private", SCRIPT_OWN, {
        ("mean_real_pair_tokens", "json.loads"): 1, ("minilmd_sft", "json.loads"): 1,
        ("write_pairs", "json.loads"): 1}),
    "scripts/gpu_check_part.py": ("private", SCRIPT_OWN, {
        ("read_metrics", "json.loads"): 1, ("recorded_kernels", "json.loads"): 1, ("write_config", "json.loads"): 1}),
    "scripts/gpu_check_determinism.py": ("private", SCRIPT_OWN, {("rewrite_checkpoint", "json.loads"): 1}),
    "scripts/gpu_check_train.py": ("private", SCRIPT_OWN, {
        ("part_run", "json.loads"): 1, ("restart_time", "json.loads"): 1}),
    "scripts/gpu_check_sft.py": ("private", SCRIPT_OWN, {
        ("mean_real_chat_tokens", "json.loads"): 1, ("write_chats", "json.loads"): 1}),
    "scripts/dpo_steps_sidebyside.py": ("private", SCRIPT_OWN, {("run_minilmd", "json.loads"): 2}),
    "scripts/resume_load_cost.py": ("private", SCRIPT_OWN + "; _load_mmap replays bb134fe's load of the checkpoint the "
                                    "script saved itself", {("_load_mmap", "json.loads"): 2,
                                                            ("measure", "json.loads"): 1}),
}
"""{module: (place, why its bytes are not another's, {(function, call): how many})}."""


class _Parses(audit_sites.Scoped):
    def __init__(self, module: ast.Module) -> None:
        super().__init__()
        self.aliases = audit_calls.assigned_aliases(module, {"json"})
        self.visit(module)

    def _kind(self, node: ast.AST) -> str | None:
        found = audit_calls.dynamic_lookup(node, {"json"}, self.aliases)
        if found:
            name = f"json.{found[1] or '<getattr>'}"
            return name if name in PARSES or found[1] is None else None
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            return self.aliases[node.id] if self.aliases.get(node.id) in PARSES else None
        if isinstance(node, ast.Attribute):
            name = audit_calls.qualified(node, self.aliases)
            return name if name in PARSES else None
        return None

    def generic_visit(self, node: ast.AST) -> None:
        kind = self._kind(node)
        if kind:
            self.count(kind)
            if isinstance(node, ast.Attribute):
                return  # json.loads counted: not its `json` again
        super().generic_visit(node)


def parses(module: ast.Module) -> Counter:
    return _Parses(module).found


def test_every_json_parse_outside_untrusted_is_reviewed():
    found = audit_sites.sites(lambda name, module: parses(module), skip=THE_ONE)
    problems = audit_sites.differences(found, REVIEWED)
    assert not problems, ("a JSON parse outside minilmd/untrusted.py (parse another's bytes with untrusted.loads; "
                          "review one of this process's own here), or a stale review:\n" + "\n".join(problems))
    assert not audit_sites.unexplained(REVIEWED)


def test_the_audit_sees_each_spelling_of_a_parse():
    module = ast.parse("import json\nimport json as j\nfrom json import loads as ld\nfrom json import load\n"
                       "def f(raw, f):\n    json.loads(raw)\n    j.loads(raw)\n    ld(raw)\n    load(f)\n"
                       "    later = json.loads\n    getattr(json, 'loads')(raw)\n    json.dumps(raw)\n"
                       "class C:\n    def g(self, raw):\n        return json.load(raw)\n")
    assert parses(module) == Counter({("f", "json.loads"): 5, ("f", "json.load"): 1, ("C.g", "json.load"): 1})
