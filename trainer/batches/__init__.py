"""What the training loop reads: the rows of a prepared corpus as a pure function of (seed, step)."""
