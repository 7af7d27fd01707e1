"""Elastic sequence parallelism: Ulysses attention for Qwen-Image that any group can use
(:mod:`spotlight.parallel.ulysses`) and the membership of the groups of persistent executors
(:mod:`spotlight.parallel.membership`)."""
