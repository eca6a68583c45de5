"""The supervisor side of minilmd: the loop, its states, the trainer as a child, GPU admission, staging, sync
and the operator's views. Never imports torch or `minilmd.trainer`: `minilmd status` must answer fast and the
supervisor stays small next to a training process that lives for days (tests/test_layers.py checks it)."""
