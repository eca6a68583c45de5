"""What a run will do, computed without torch: the rows of a prepared corpus as a pure function of (seed, step)
(the samplers), how many rows an epoch holds and how many steps the budget allows, the learning-rate schedule, the
FLOPs a token costs, and when early stopping ends a run. The trainer, `run --check` and `corpus report` call the
same functions."""
