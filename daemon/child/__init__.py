"""The trainer as a child of the supervisor: launch, watch, stop, orphans, stack dumps."""
