"""Interop: OpenEnv and TRL both ways, and verifiers environments as tasksets, built on the `openenv`, `trl` and
`verifiers` packages (optional extras)."""
