"""Training: traces to samples, advantages, batches, the trainer, weight sync and the orchestrator."""
