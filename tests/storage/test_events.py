"""The run's event log: JSON-lines batches, one object each, read back in time order."""
from __future__ import annotations

import pytest

from storage import RunStore


def test_batches_read_back_in_time_order_on_every_backend(store_config):
    store = RunStore.open(store_config)
    assert store.read_events() == []
    store.write_events("iter-000001-aa", [{"kind": "injector", "what": "kill", "at": 30.0},
                                          {"kind": "request", "what": "requeued", "at": 31.5}])
    store.write_events("iter-000000-aa", [{"kind": "request", "what": "assigned", "at": 10.0}])
    store.write_events("close-aa", [])   # nothing to say writes nothing
    events = RunStore.open(store_config, create=False).read_events()
    assert [e["at"] for e in events] == [10.0, 30.0, 31.5]
    assert events[1] == {"kind": "injector", "what": "kill", "at": 30.0}


def test_a_batch_is_never_overwritten(store_config):
    store = RunStore.open(store_config)
    store.write_events("iter-000003-bb", [{"kind": "dispatch", "what": "starved", "at": 1.0}])
    with pytest.raises(FileExistsError, match="iter-000003-bb.jsonl exists"):
        store.write_events("iter-000003-bb", [{"kind": "dispatch", "what": "gave_up", "at": 2.0}])
    assert [e["what"] for e in store.read_events()] == ["starved"]
