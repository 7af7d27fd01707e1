"""Two drivers on one store: no lost manifest update, and a taken-over driver writes nothing."""
from __future__ import annotations

import numpy as np
import pytest

from storage import RunStore
from storage.driver_lease import DriverLease
from storage.errors import DriverFenced
from storage.lease import Holder, LeaseHeld

A = Holder(host="driver-a", pid=11, started="2026-11-27T10:00:00Z", token="a" * 8)
B = Holder(host="driver-b", pid=22, started="2026-11-27T10:05:00Z", token="b" * 8)


def test_a_writer_with_a_stale_copy_loses_no_update(store_config):
    first = RunStore.open(store_config, writer=True)
    second = RunStore.open(store_config, writer=True)
    first.mark_stage_done("iter-0/rollout")
    second.mark_stage_done("iter-0/explore")        # its cached copy has never seen rollout
    first.mark_stage_done("iter-0/reward")          # nor has first's seen explore
    reader = RunStore.open(store_config, create=False)
    assert set(reader.manifest.stages()) == {"iter-000000/rollout", "iter-000000/explore",
                                             "iter-000000/reward"}


def test_a_second_driver_is_refused_while_the_first_holds_the_lease(store_config):
    store = RunStore.open(store_config, writer=True)
    DriverLease.acquire(store.location, ttl_s=60, holder=A)
    with pytest.raises(LeaseHeld, match=r"host driver-a \(pid 11.*expires in \d+ s"):
        DriverLease.acquire(store.location, ttl_s=60, holder=B)


class Clock:
    """Time that moves only when the waiting driver sleeps; ``during`` runs at each sleep."""

    def __init__(self, during=lambda now: None) -> None:
        self.now, self.during, self.slept = 1000.0, during, 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds
        self.during(self.now)


def test_a_takeover_right_after_a_crash_waits_the_lease_out_and_says_so(store_config):
    store = RunStore.open(store_config, writer=True)
    clock = Clock()
    crashed = DriverLease.acquire(store.location, ttl_s=30, holder=A, clock=clock)   # never renewed
    clock.now += 4
    said = []
    taken = DriverLease.acquire(store.location, ttl_s=30, holder=B, takeover=True, clock=clock,
                                sleep=clock.sleep, on_wait=said.append)
    assert taken.epoch == crashed.epoch + 1 and taken.took_over.holder == A
    assert 26 <= clock.slept <= 27.5   # the lease's 30 s less the 4 s already gone, and a read
    assert said == ["lease: held by the driver on host driver-a (pid 11, epoch 1), unrenewed for "
                    "4 s; waiting up to 26 s for it to expire (a live driver renews it before)"]


def test_a_takeover_of_a_lease_renewed_while_it_waits_is_refused(store_config):
    store = RunStore.open(store_config, writer=True)
    live = None

    def renewing(now: float) -> None:   # the holder is alive: it renews every third of its TTL
        if now - live.held.renewed_at >= 10:
            live.renew()

    clock = Clock(renewing)
    live = DriverLease.acquire(store.location, ttl_s=30, holder=A, clock=clock)
    with pytest.raises(LeaseHeld, match=r"renewed while this driver waited.*--takeover --force"):
        DriverLease.acquire(store.location, ttl_s=30, holder=B, takeover=True, clock=clock,
                            sleep=clock.sleep, on_wait=lambda line: None)
    assert clock.slept <= 11   # it stopped at the first renewal, not at an expiry
    live.verify()   # the lease is still A's


def test_after_a_takeover_every_write_of_the_old_driver_is_refused(store_config):
    old = RunStore.open(store_config, writer=True)
    old_lease = DriverLease.acquire(old.location, ttl_s=60, holder=A)
    old.hold(old_lease)
    old.mark_stage_done("iter-0/rollout", {"by": "old"})
    old.put_json("iter-0/rollout", "tasks", {"by": "old"})

    new = RunStore.open(store_config, create=False, writer=True)
    new_lease = DriverLease.acquire(new.location, ttl_s=60, holder=B, force=True)
    new.hold(new_lease)
    assert new_lease.epoch == old_lease.epoch + 1
    new.mark_stage_done("iter-0/explore", {"by": "new"})

    with pytest.raises(DriverFenced, match=r"driver-b.*took it over at epoch 2"):
        old.mark_stage_done("iter-0/reward", {"by": "old"})
    refused = {
        "arrays": lambda: old.put_arrays("iter-0/rollout", "seeds", {"s": np.arange(3)}),
        "json": lambda: old.put_json("iter-0/rollout", "tasks", {"by": "old, late"}),
        "rewards": lambda: old.append_rewards(0, {"reward": np.zeros(2)}),
        "events": lambda: old.write_events("late", [{"kind": "x", "at": 1.0}]),
        "checkpoint": lambda: old.save_checkpoint(1, {"w": np.zeros(2, np.float32)}),
    }
    for what, write in refused.items():
        with pytest.raises(DriverFenced, match="driver-b.*took it over at epoch 2"):
            write()
    with pytest.raises(DriverFenced):
        old_lease.renew()

    after = RunStore.open(store_config, create=False)
    assert set(after.manifest.stages()) == {"iter-000000/rollout", "iter-000000/explore"}
    assert after.get_json("iter-0/rollout", "tasks") == {"by": "old"}
    assert after.latest_checkpoint() is None
    assert after.read_events() == []


def test_a_released_lease_lets_the_next_driver_in_without_takeover(store_config):
    store = RunStore.open(store_config, writer=True)
    first = DriverLease.acquire(store.location, ttl_s=60, holder=A)
    first.release()
    second = DriverLease.acquire(store.location, ttl_s=60, holder=B)
    assert second.epoch == 2


def test_the_renewing_driver_hears_of_a_takeover_and_stops_renewing(store_config):
    import threading

    store = RunStore.open(store_config, writer=True)
    heard = threading.Event()
    old = DriverLease.acquire(store.location, ttl_s=0.6, holder=A)
    old.start_renewing(on_lost=lambda err: heard.set())
    DriverLease.acquire(store.location, ttl_s=60, holder=B, force=True)
    assert heard.wait(timeout=60), "the old driver never noticed the takeover"
    with pytest.raises(DriverFenced, match="driver-b"):
        old.check()
    old.release()   # a fenced driver's release leaves the new holder's lease alone
    with pytest.raises(LeaseHeld, match="driver-b"):
        DriverLease.acquire(store.location, ttl_s=60, holder=A)


def test_taking_the_lease_alone_fences_the_old_drivers_manifest_updates(store_config):
    old = RunStore.open(store_config, writer=True)
    old.hold(DriverLease.acquire(old.location, ttl_s=60, holder=A))
    old.mark_stage_done("iter-0/rollout")
    new = RunStore.open(store_config, create=False, writer=True)
    new.hold(DriverLease.acquire(new.location, ttl_s=60, holder=B, force=True))   # nothing else
    with pytest.raises(DriverFenced, match="epoch 2"):
        old.mark_stage_done("iter-0/reward")
    assert set(RunStore.open(store_config, create=False).manifest.stages()) == {
        "iter-000000/rollout"}


def test_a_manifest_stamped_by_a_newer_epoch_refuses_an_older_writer(store_config):
    """The second line of defence, should the lease check be passed just before a takeover:
    the compare-and-swap re-reads a manifest the newer driver wrote, and refuses."""
    old = RunStore.open(store_config, writer=True)
    old.manifest.epoch = 1
    old.mark_stage_done("iter-0/rollout")
    new = RunStore.open(store_config, create=False, writer=True)
    new.manifest.epoch = 2
    new.mark_stage_done("iter-0/explore")
    with pytest.raises(DriverFenced, match=r"epoch 2, after this driver's epoch 1"):
        old.mark_stage_done("iter-0/reward")


def test_a_takeover_between_a_renewals_read_and_write_names_the_taker(store_config,
                                                                      monkeypatch):
    """The renewal read the lease, then B took it over, then the renewal's conditional write
    failed: the old driver is fenced with B named, not with a bare write conflict."""
    import storage.driver_lease as driver_lease

    store = RunStore.open(store_config, writer=True)
    old = DriverLease.acquire(store.location, ttl_s=60, holder=A)
    real = driver_lease.replace_if

    def taken_meanwhile(*args, **kwargs):
        monkeypatch.setattr(driver_lease, "replace_if", real)   # B's own writes go through
        DriverLease.acquire(store.location, ttl_s=60, holder=B, force=True)
        return real(*args, **kwargs)

    monkeypatch.setattr(driver_lease, "replace_if", taken_meanwhile)
    with pytest.raises(DriverFenced, match="driver-b"):
        old.renew()
    assert old.lost is not None
