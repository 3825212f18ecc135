"""Core: the pure data of tracegym (messages, task data, traces, errors, timing); nothing here does I/O."""
