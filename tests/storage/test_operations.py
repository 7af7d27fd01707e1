"""The store's operation counter: every access of a run location counted once, by kind."""
from __future__ import annotations

from storage import RunStore, operations


def test_kinds_drop_their_object_and_conditional_writes_count_as_writes():
    assert operations.kind_of("write latent step 3 to") == "write"
    assert operations.kind_of("conditional write") == "write"
    assert operations.kind_of("append rewards to") == "write"
    assert operations.kind_of("list") == "list"
    assert operations.reads({"read": 3, "check": 1, "list": 2, "open": 1, "write": 9}) == 7


def test_a_stores_reads_and_writes_are_counted_as_they_happen(tmp_path):
    store = RunStore.open(f"file://{tmp_path}/run")
    before = operations.operations()
    store.location.write_bytes(b"{}", "a.json")
    store.location.read_bytes("a.json")
    store.location.read_bytes("a.json")
    assert store.location.exists("a.json")
    after = operations.operations()
    grew = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
    assert grew == {"write": 1, "read": 2, "check": 1}
