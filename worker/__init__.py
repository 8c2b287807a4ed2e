"""freight's data plane: Celery tasks, the shard runner, the embedded runner and the engine."""
