"""Benchmarks behind `minilmd bench prepare`, `bench packing` and `bench checkpoint`."""
