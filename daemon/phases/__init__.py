"""The supervisor's waiting phases (init, GPU, space) and the full-run.dir watch."""
