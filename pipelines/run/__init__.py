"""One RL iteration: the driver and its stages, the worker tasks, seed exploration."""
