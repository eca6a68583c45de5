"""Shared test set-up. Tests run on CPU, on 2 cores: keep torch to one thread per process."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
