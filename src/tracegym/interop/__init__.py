"""Interop: OpenEnv and TRL both ways, built on the `openenv` and `trl` packages (optional extras)."""
