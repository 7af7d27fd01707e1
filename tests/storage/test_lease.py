"""The driver lease as a pure state machine: every transition, with a hand-driven clock."""
from __future__ import annotations

import pytest

from storage.lease import (
    ALIVE,
    TAKE,
    WAIT,
    Holder,
    Lease,
    LeaseHeld,
    LeaseLost,
    acquire,
    release,
    renew,
    watch_for_takeover,
)

A = Holder(host="driver-a", pid=11, started="2026-11-27T10:00:00Z", token="a" * 8)
B = Holder(host="driver-b", pid=22, started="2026-11-27T10:05:00Z", token="b" * 8)
TTL = 30.0


def test_the_first_driver_gets_epoch_one_and_an_expiry():
    lease = acquire(None, A, now=100.0, ttl_s=TTL)
    assert (lease.holder, lease.epoch, lease.expires_at, lease.released) == (A, 1, 130.0, False)
    assert lease.live(129.9) and not lease.live(130.0)


def test_a_second_driver_is_refused_while_the_lease_is_live_and_told_who_holds_it():
    held = acquire(None, A, now=100.0, ttl_s=TTL)
    with pytest.raises(LeaseHeld, match=r"host driver-a \(pid 11.*epoch 1\); its lease expires "
                                        r"in 20 s\. .*--takeover --force"):
        acquire(held, B, now=110.0, ttl_s=TTL)
    with pytest.raises(LeaseHeld):   # the transition: --takeover takes only an expired lease
        acquire(held, B, now=110.0, ttl_s=TTL, takeover=True)   # (its driver waits it out)


def test_an_expired_lease_needs_takeover_and_the_epoch_moves_on():
    held = acquire(None, A, now=100.0, ttl_s=TTL)
    with pytest.raises(LeaseHeld, match=r"expired 20 s ago without being released.*--takeover"):
        acquire(held, B, now=150.0, ttl_s=TTL)
    taken = acquire(held, B, now=150.0, ttl_s=TTL, takeover=True)
    assert (taken.holder, taken.epoch, taken.expires_at) == (B, 2, 180.0)


def test_a_takeover_watching_a_live_lease_takes_it_once_it_expires_unrenewed():
    seen = acquire(None, A, now=100.0, ttl_s=TTL)
    assert watch_for_takeover(seen, seen, now=110.0) == WAIT
    assert watch_for_takeover(seen, seen, now=130.0) == TAKE   # expired, never renewed
    assert watch_for_takeover(seen, release(seen, seen, 105.0), now=105.0) == TAKE
    assert watch_for_takeover(seen, None, now=105.0) == TAKE


def test_a_lease_renewed_or_taken_while_watched_means_its_driver_is_alive():
    seen = acquire(None, A, now=100.0, ttl_s=TTL)
    assert watch_for_takeover(seen, renew(seen, seen, 110.0, TTL), now=111.0) == ALIVE
    other = acquire(seen, B, now=131.0, ttl_s=TTL, takeover=True)   # another driver was faster
    assert watch_for_takeover(seen, other, now=132.0) == ALIVE


def test_force_takes_a_live_lease():
    held = acquire(None, A, now=100.0, ttl_s=TTL)
    assert acquire(held, B, now=101.0, ttl_s=TTL, force=True).epoch == 2


def test_a_released_lease_is_free_and_still_bumps_the_epoch():
    held = acquire(None, A, now=100.0, ttl_s=TTL)
    done = release(held, held, now=120.0)
    assert done.released and not done.live(120.0)
    nxt = acquire(done, B, now=121.0, ttl_s=TTL)
    assert (nxt.holder, nxt.epoch) == (B, 2)
    again = acquire(nxt, A, now=122.0, ttl_s=TTL, force=True)
    assert again.epoch == 3


def test_renewal_moves_the_expiry_and_keeps_the_epoch():
    held = acquire(None, A, now=100.0, ttl_s=TTL)
    later = renew(held, held, now=125.0, ttl_s=TTL)
    assert (later.epoch, later.expires_at, later.renewed_at) == (1, 155.0, 125.0)
    assert acquire(later, A, now=126.0, ttl_s=TTL).epoch == 1   # re-acquiring my own lease


def test_the_old_driver_learns_it_was_fenced_when_it_renews_or_releases():
    mine = acquire(None, A, now=100.0, ttl_s=TTL)
    theirs = acquire(mine, B, now=200.0, ttl_s=TTL, takeover=True)
    with pytest.raises(LeaseLost, match=r"driver on host driver-b \(pid 22\) took it over at "
                                        r"epoch 2 \(this driver held epoch 1\)"):
        renew(theirs, mine, now=201.0, ttl_s=TTL)
    with pytest.raises(LeaseLost, match="took it over"):
        release(theirs, mine, now=201.0)
    with pytest.raises(LeaseLost, match="deleted"):
        renew(None, mine, now=201.0, ttl_s=TTL)
    with pytest.raises(LeaseLost, match="already released"):
        renew(release(mine, mine, now=150.0), mine, now=151.0, ttl_s=TTL)


def test_the_record_round_trips_and_a_bad_one_is_named():
    lease = acquire(None, A, now=100.0, ttl_s=TTL)
    assert Lease.from_json(lease.to_json(), "s3://b/run/lease.json") == lease
    with pytest.raises(ValueError, match=r"s3://b/run/lease.json is not a readable driver lease"):
        Lease.from_json(b'{"format": "other"}', "s3://b/run/lease.json")
    with pytest.raises(ValueError, match="ttl_s must be positive"):
        acquire(None, A, now=0.0, ttl_s=0)
