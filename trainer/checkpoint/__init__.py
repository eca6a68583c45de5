"""Writing and loading checkpoints (torch).

The format and its strict, torch-free validation are `minilmd.checkpoint`."""
