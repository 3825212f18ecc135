"""Runtimes: where code runs as processes of its own: started in a process group, stopped with it, and gone when
its parent is (depends on `core` only)."""
