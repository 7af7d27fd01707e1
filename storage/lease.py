"""The driver lease: who may write a run's state, as a pure state machine.

A run store has one writer of run state at a time -- the driver holding ``lease.json``. The
lease names its holder (host, pid, start time and a random token), an *epoch* and an expiry.
Every acquisition bumps the epoch; the epoch is the fencing token: run-state writes carry it and
the store refuses a writer whose epoch is older than the newest one (see ``storage.fence``).

States of the stored lease, and what a driver that wants it may do::

    absent / released  --acquire-->           held by me (epoch + 1)
    held, live          --acquire-->          refused: LeaseHeld (names holder and expiry)
    held, live          --acquire, force-->   held by me (epoch + 1): a takeover
    held, expired       --acquire-->          refused unless takeover (the holder may be a
                                              partitioned driver that still runs)
    held, expired       --acquire, takeover--> held by me (epoch + 1)
    held by me          --renew-->            held by me, later expiry
    held by someone else / newer epoch --renew or release--> LeaseLost (I am fenced)

These functions take the current record and a clock reading and return the next record; they
do no I/O, so every transition is tested without a store or a clock.
"""
from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, replace

from .errors import StorageError

LEASE = "lease.json"
FORMAT = "spotlight-lease"


class LeaseHeld(StorageError):
    """Another driver holds the run's lease."""

    def __init__(self, lease: "Lease", now: float, hint: str) -> None:
        holder = lease.holder
        left = lease.expires_at - now
        when = (f"expires in {left:.0f} s" if left > 0
                else f"expired {-left:.0f} s ago without being released")
        super().__init__(f"the run is held by the driver on host {holder.host} (pid "
                         f"{holder.pid}, started {holder.started}, epoch {lease.epoch}); its "
                         f"lease {when}. {hint}")
        self.lease = lease


class LeaseLost(RuntimeError):
    """This driver no longer holds the run's lease: another driver took it over."""


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a lease. ``token`` tells two drivers with the same host and pid apart."""

    host: str
    pid: int
    started: str
    token: str

    @classmethod
    def this_process(cls) -> "Holder":
        return cls(host=socket.gethostname(), pid=os.getpid(),
                   started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   token=uuid.uuid4().hex)


@dataclass(frozen=True, slots=True)
class Lease:
    """A stored lease. ``expires_at`` and ``renewed_at`` are Unix times (the store's readers
    compare them with their own clocks: keep hosts on NTP; the TTL dwarfs the skew)."""

    holder: Holder
    epoch: int
    expires_at: float
    renewed_at: float
    released: bool = False

    def live(self, now: float) -> bool:
        return not self.released and now < self.expires_at

    def to_json(self) -> bytes:
        return json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, url: str) -> "Lease":
        try:
            raw = json.loads(data)
            if raw.pop("format", None) != FORMAT:
                raise ValueError("not a Spotlight lease")
            return cls(holder=Holder(**raw.pop("holder")), **raw)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{url} is not a readable driver lease ({exc}); if no driver runs "
                             "on this store, delete it and resume") from exc


def acquire(current: Lease | None, me: Holder, now: float, ttl_s: float, *,
            takeover: bool = False, force: bool = False) -> Lease:
    """The lease ``me`` holds after acquiring it, or LeaseHeld with what to do instead."""
    if ttl_s <= 0:
        raise ValueError(f"lease ttl_s must be positive, got {ttl_s}")
    if current is not None and not current.released and current.holder != me:
        if current.live(now) and not force:
            raise LeaseHeld(current, now, "Wait for it to finish, or, if that driver is gone "
                            "for good, rerun with --takeover (it waits the lease out) or "
                            "--takeover --force.")
        if not current.live(now) and not (takeover or force):
            raise LeaseHeld(current, now, "If that driver is gone (crashed, or its host is "
                            "cut off), rerun with --takeover: its writes are refused from then on.")
    epoch = current.epoch + 1 if current is not None else 1
    if current is not None and current.holder == me and not current.released:
        epoch = current.epoch   # acquiring what I already hold is a renewal
    return Lease(holder=me, epoch=epoch, expires_at=now + ttl_s, renewed_at=now)


# What a --takeover that found a live lease learns from each later read of it.
TAKE, WAIT, ALIVE = "take", "wait", "alive"


def watch_for_takeover(seen: Lease, current: Lease | None, now: float) -> str:
    """A just-crashed driver's lease looks live until it expires: so a ``--takeover`` that finds
    one watches it, as the leader elections of etcd or Kubernetes wait out a holder's lease.
    :data:`ALIVE`: renewed since ``seen`` (or taken by another driver) -- its driver is alive,
    and only ``--force`` takes it; :data:`TAKE`: released, or expired unrenewed; :data:`WAIT`:
    neither yet."""
    if current is None or current.released:
        return TAKE
    if (current.holder, current.epoch) != (seen.holder, seen.epoch) \
            or current.renewed_at > seen.renewed_at:
        return ALIVE
    return WAIT if current.live(now) else TAKE


def renew(current: Lease | None, mine: Lease, now: float, ttl_s: float) -> Lease:
    """``mine`` with a later expiry; LeaseLost if the stored lease is no longer mine."""
    _still_mine(current, mine, "renew")
    return replace(mine, expires_at=now + ttl_s, renewed_at=now)


def release(current: Lease | None, mine: Lease, now: float) -> Lease:
    """``mine`` marked released, so the next driver needs no --takeover."""
    _still_mine(current, mine, "release")
    return replace(mine, released=True, expires_at=now, renewed_at=now)


def _still_mine(current: Lease | None, mine: Lease, action: str) -> None:
    if current is None:
        raise LeaseLost(f"cannot {action} the lease: it was deleted from the store")
    if current.holder != mine.holder or current.epoch != mine.epoch:
        raise LeaseLost(f"cannot {action} the lease: the driver on host {current.holder.host} "
                        f"(pid {current.holder.pid}) took it over at epoch {current.epoch} "
                        f"(this driver held epoch {mine.epoch})")
    if current.released:
        raise LeaseLost(f"cannot {action} the lease: it was already released")
