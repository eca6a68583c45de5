"""The blocking jobs the supervisor runs in threads: staging the corpus, syncing checkpoints."""
