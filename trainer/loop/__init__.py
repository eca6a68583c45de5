"""The training loop: the Trainer, its schedule, metrics, and injected faults for tests."""
