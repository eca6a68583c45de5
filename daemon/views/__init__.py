"""The operator's views, run by `minilmd status/logs/stop/plot/forget`, never by the supervisor: status, logs and
plot only read; stop signals the run's proven supervisor (minilmd/procs.py) and forget deletes a registry entry."""
