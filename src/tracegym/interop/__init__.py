"""Interop: tracegym with the field's own packages, both ways: OpenEnv and TRL (optional extras)."""
