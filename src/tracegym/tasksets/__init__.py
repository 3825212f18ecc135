"""Tasksets: the built-in tasksets, each a small module with its data generated in code."""
