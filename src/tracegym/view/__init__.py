"""The trace viewer: a read-only local web page over eval and RL run folders (`tracegym view RUN_DIR`)."""
