"""In a Slurm job: the allocation and preemption (job), each node's step (node)."""
