"""This machine and its other users: GPUs (NVML), leases, the run lock, the run registry, systemd,
node_exporter's textfile."""
