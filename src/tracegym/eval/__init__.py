"""Evaluation: run folders, summaries, the live dashboard, resume and re-scoring."""
