"""Seed exploration: choose, per prompt, the seeds whose rewards spread the most."""
from spotlight.exploration.selection import Selection, fill_seeds, max_variance_subset, select_seeds

__all__ = ["Selection", "fill_seeds", "max_variance_subset", "select_seeds"]
