"""Spotlight: RL post-training of Diffusion Transformers on spot capacity.

``import spotlight`` is the user's face. The CLI entry point and ``Session`` live in
``pipelines`` and are imported lazily, so the library layers never import the pipeline layer.
"""
from __future__ import annotations

__version__ = "0.1.0"


def main(argv: list[str] | None = None) -> int:
    """Console entry point ``spotlight``."""
    from pipelines.front.cli import main as cli_main

    return cli_main(argv)


def __getattr__(name: str):
    if name == "Session":
        from pipelines.front.session import Session

        return Session
    raise AttributeError(f"module 'spotlight' has no attribute {name!r}")
