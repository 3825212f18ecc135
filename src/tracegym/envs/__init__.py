"""Envs: tasks, tasksets, tools, class-based environments, and the one rollout loop that runs them."""
