"""The operator's read-only views, run by `minilmd status/logs/stop/plot/forget`, never by the
supervisor."""
