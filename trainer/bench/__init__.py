"""Benchmarks behind `minilmd bench ...`: prepare throughput, packing against padding, checkpoint stalls."""
