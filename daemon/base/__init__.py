"""The daemon's bottom, which every other folder of daemon/ builds on: the phases and every allowed transition
(states.py), the sections of state.json (statesections.py), the run's state and its event log (runstate.py), and
the worker thread a blocking job runs in (worker.py). It imports nothing of daemon/ above it."""
