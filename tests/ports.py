"""A free TCP port on loopback, for the tests that start a server of their own."""
from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Dask's scheduler serves HTTP (health, metrics) even with its dashboard off, on 8787 unless
# told otherwise, so two test processes at once collide there and warn. Each in-process
# cluster gets a free loopback port of its own, its dashboard still off.
LOOPBACK_HTTP = {"dashboard_address": None,
                 "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"}}
