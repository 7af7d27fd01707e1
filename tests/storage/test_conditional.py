"""Conditional writes on every backend: create-if-absent, replace-if-unchanged, no lost update."""
from __future__ import annotations

import json
import multiprocessing
import threading
import uuid

import pytest

from storage import StorageConfig
from storage.conditional import WriteConflict, create_exclusive, read_versioned, replace_if
from storage.urls import check_reachable
from storage.urls import open_location as _open_location


def open_location(config: StorageConfig):
    loc = _open_location(config)
    check_reachable(loc, create_bucket=True)
    return loc


def test_create_refuses_an_existing_object_and_keeps_it(store_config):
    loc = open_location(store_config)
    version = create_exclusive(loc, b"first", "lease.json")
    with pytest.raises(WriteConflict, match=r"lease\.json refused: it already exists"):
        create_exclusive(loc, b"second", "lease.json")
    assert read_versioned(loc, "lease.json").data == b"first"
    assert read_versioned(loc, "lease.json").version == version


def test_replace_needs_the_version_it_read(store_config):
    loc = open_location(store_config)
    create_exclusive(loc, b"v1", "m.json")
    seen = read_versioned(loc, "m.json")
    new_version = replace_if(loc, b"v2", seen.version, "m.json")
    assert read_versioned(loc, "m.json") == type(seen)(b"v2", new_version)
    with pytest.raises(WriteConflict, match="another writer changed it"):
        replace_if(loc, b"v3-from-a-stale-reader", seen.version, "m.json")
    assert read_versioned(loc, "m.json").data == b"v2"


def test_replace_of_a_missing_object_is_a_conflict(store_config):
    loc = open_location(store_config)
    with pytest.raises(WriteConflict):
        replace_if(loc, b"x", "no-such-version", "gone.json")
    with pytest.raises(FileNotFoundError, match="gone.json does not exist"):
        read_versioned(loc, "gone.json")


def _increment(loc, times: int) -> int:
    """Add 1 to the counter ``times`` times by compare-and-swap; return the conflicts seen.

    Each write names its writer, as the store's own records do: equal bytes then mean this
    writer's PUT landed (what a retried conditional PUT relies on)."""
    conflicts, writer = 0, uuid.uuid4().hex
    for _ in range(times):
        while True:
            seen = read_versioned(loc, "counter.json")
            value = json.loads(seen.data)["n"] + 1
            data = json.dumps({"n": value, "by": writer}).encode()
            try:
                replace_if(loc, data, seen.version, "counter.json")
                break
            except WriteConflict:
                conflicts += 1
    return conflicts


def test_concurrent_threads_lose_no_update(racing_config):
    loc = open_location(racing_config)
    create_exclusive(loc, b'{"n": 0}', "counter.json")
    threads = [threading.Thread(target=_increment, args=(open_location(racing_config), 15))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert json.loads(read_versioned(loc, "counter.json").data)["n"] == 60


def _process_increments(config: StorageConfig, times: int, queue) -> None:
    queue.put(_increment(open_location(config), times))


# memory:// is per process
@pytest.mark.parametrize("racing_config", ["file", "s3"], indirect=True)
def test_concurrent_processes_lose_no_update(racing_config):
    """Separate processes (the way two drivers or two attempts race): the store orders them."""
    config = racing_config
    loc = open_location(config)
    create_exclusive(loc, b'{"n": 0}', "counter.json")
    ctx = multiprocessing.get_context("spawn")   # s3fs is not fork-safe
    queue = ctx.Queue()
    procs = [ctx.Process(target=_process_increments, args=(config, 10, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for _ in procs:   # each reports its conflicts: retries are allowed, lost updates are not
        queue.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert json.loads(read_versioned(loc, "counter.json").data)["n"] == 30
