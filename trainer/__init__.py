"""The training side of minilmd: what needs torch, and only that (tests/test_layers.py fails on a trainer module that
does not). The corpus tools are minilmd/corpus/, and what a run will do without torch (its rows, step budget,
schedule, FLOPs) is minilmd/plan/.

Subpackages by concern: `model` (the model, generation, export, LoRA), `checkpoint` (save, load, the asynchronous
writer, the weights [init] from names), `loop` (the Trainer), `bench` (the benchmarks that run the model).
"""
