"""The supervisor side of minilmd. Never imports torch at module level: `minilmd status` must answer fast and
the supervisor stays small next to a training process that lives for days."""
