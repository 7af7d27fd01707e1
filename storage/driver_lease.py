"""A driver's lease on its run store: acquired with a conditional write, renewed in the
background, released at the end; the pure transitions live in ``storage.lease``.

The lease is what lets a second ``spotlight run --resume URL`` stop at once, before it starts a
cluster, and what fences the first driver after a ``--takeover``: the taker's epoch is higher,
and the store refuses run-state writes of an older epoch (``DriverLease.verify``, one read of
the lease, before each write and each manifest update; the manifest's compare-and-swap, which
finds a newer epoch stamped in it, behind that).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from .conditional import WriteConflict, create_exclusive, read_versioned, replace_if
from .errors import DriverFenced, StorageError
from .lease import ALIVE, LEASE, TAKE, Holder, Lease, LeaseHeld, LeaseLost, watch_for_takeover
from .lease import acquire as acquired_lease
from .lease import release as released_lease
from .lease import renew as renewed_lease
from .urls import RunLocation

log = logging.getLogger(__name__)
_RACES = 5   # drivers acquiring at the same instant: re-read and decide again this often
_LOOK_EVERY_S = 1.0   # how often the renewing thread reads the stored lease between renewals


class DriverLease:
    """The lease this driver holds. ``epoch`` is its fencing token."""

    def __init__(self, location: RunLocation, held: Lease, ttl_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.location = location
        self.held = held
        self.acquired_at = held.renewed_at   # when it was taken (Unix time): the event's time
        self.ttl_s, self._clock = ttl_s, clock
        self.lost: DriverFenced | None = None
        self.took_over: Lease | None = None   # the unreleased lease this one replaced
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_lost: Callable[[DriverFenced], None] | None = None
        self._lock = threading.Lock()

    @property
    def epoch(self) -> int:
        return self.held.epoch

    @property
    def url(self) -> str:
        return self.location.child_url(LEASE)

    def event(self) -> dict:
        """What the run's event log keeps of this lease (the ``lease`` event)."""
        out = {"epoch": self.epoch, "host": self.held.holder.host, "pid": self.held.holder.pid,
               "at": self.acquired_at}
        if self.took_over is not None:
            old = self.took_over
            out["took_over_from"] = {"host": old.holder.host, "pid": old.holder.pid,
                                     "epoch": old.epoch, "expired": old.expires_at
                                     <= self.held.renewed_at}
        return out

    # -- acquiring ----------------------------------------------------------------------------
    @classmethod
    def acquire(cls, location: RunLocation, *, ttl_s: float = 30.0, takeover: bool = False,
                force: bool = False, holder: Holder | None = None,
                clock: Callable[[], float] = time.time,
                sleep: Callable[[float], None] = time.sleep,
                on_wait: Callable[[str], None] | None = None) -> "DriverLease":
        """Take the run's lease, or raise ``LeaseHeld`` naming the holder and what to do. A
        ``takeover`` (without ``force``) that finds the lease live first waits it out
        (:func:`storage.lease.watch_for_takeover`), saying so through ``on_wait``."""
        me = holder or Holder.this_process()
        if takeover and not force:
            _wait_out(location, me, clock, sleep, on_wait or log.warning)
        for _ in range(_RACES):
            current, version = _read(location)
            held = acquired_lease(current, me, clock(), ttl_s, takeover=takeover, force=force)
            try:
                if version is None:
                    create_exclusive(location, held.to_json(), LEASE)
                else:
                    replace_if(location, held.to_json(), version, LEASE)
            except WriteConflict:
                continue   # another driver wrote the lease between our read and write
            taken = cls(location, held, ttl_s, clock)
            if current is not None and current.holder != me and not current.released:
                log.warning("storage: took over %s from host %s pid %s (epoch %d -> %d)",
                            location.url, current.holder.host, current.holder.pid,
                            current.epoch, held.epoch)
                taken.took_over = current
            return taken
        raise StorageError(f"{location.child_url(LEASE)}: {_RACES} drivers raced for the lease "
                           "at once; try again")

    # -- holding ------------------------------------------------------------------------------
    def start_renewing(self,
                       on_lost: Callable[[DriverFenced], None] | None = None) -> "DriverLease":
        """Renew every third of the TTL in a daemon thread; ``on_lost`` hears a takeover."""
        self._on_lost = on_lost
        self._thread = threading.Thread(target=self._renew_loop, name="spotlight-lease",
                                        daemon=True)
        self._thread.start()
        return self

    def renew(self) -> None:
        """Push the expiry out once; DriverFenced if another driver took the lease."""
        with self._lock:
            self.check()
            current, version = _read(self.location)
            try:
                held = renewed_lease(current, self.held, self._clock(), self.ttl_s)
                replace_if(self.location, held.to_json(), version, LEASE)
            except LeaseLost as exc:
                self._lose(str(exc))   # raises DriverFenced
            except WriteConflict:
                # Changed between the read and the write: a takeover, most likely. Say whose.
                now, _ = _read(self.location)
                if now is not None and now.epoch == self.epoch and now.holder == self.held.holder:
                    raise StorageError(f"{self.url} changed under its holder (epoch "
                                       f"{self.epoch}) while it renewed; retrying") from None
                self._lose(_taken_by(now, self.epoch))   # raises DriverFenced
            else:
                self.held = held

    def check(self) -> None:
        """Raise DriverFenced if this driver lost the lease (cheap: no store access)."""
        if self.lost is not None:
            raise self.lost

    def verify(self) -> None:
        """Read the stored lease and raise DriverFenced unless it is still ours: the guard
        before a run-state write."""
        self.check()
        current, _ = _read(self.location)
        if current is None or current.epoch != self.epoch or current.holder != self.held.holder:
            self._lose(_taken_by(current, self.epoch))

    def release(self) -> None:
        """Stop renewing and mark the lease released, so the next driver needs no takeover."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
        if self.lost is not None:
            return
        with self._lock:
            try:
                current, version = _read(self.location)
                released = released_lease(current, self.held, self._clock())
                replace_if(self.location, released.to_json(), version, LEASE)
            except (LeaseLost, WriteConflict, StorageError, OSError) as exc:
                log.warning("storage: could not release the lease of %s: %s; the next driver "
                            "needs --takeover once it expires", self.location.url, exc)

    def _renew_loop(self) -> None:
        # Renewed every third of the TTL; looked at (one read) every second in between, so a
        # takeover stops this driver within about a second, not at its next renewal.
        renew_every = self.ttl_s / 3
        renewed = time.monotonic()
        while not self._stop.wait(min(_LOOK_EVERY_S, renew_every)):
            try:
                if time.monotonic() - renewed >= renew_every:
                    self.renew()
                    renewed = time.monotonic()
                else:
                    self.verify()
            except DriverFenced:
                return
            except (StorageError, OSError) as exc:   # the store is away: keep trying till expiry
                if self._clock() >= self.held.expires_at:
                    self._lose(f"could not renew it before it expired ({exc})", raise_=False)
                    return
                log.warning("storage: lease renewal of %s failed (%s); retrying",
                            self.location.url, exc)

    def _lose(self, why: str, raise_: bool = True) -> None:
        if self.lost is None:
            self.lost = DriverFenced(
                f"this driver (epoch {self.epoch}) no longer holds the run {self.location.url}: "
                f"{why}. It stops; what it committed before stays, and the run goes on with "
                "the driver that holds the lease")
            log.error("storage: %s", self.lost)
            if self._on_lost is not None:
                self._on_lost(self.lost)
        if raise_:
            raise self.lost


def _wait_out(location: RunLocation, me: Holder, clock: Callable[[], float],
              sleep: Callable[[float], None], say: Callable[[str], None]) -> None:
    """Return once the stored lease is free to take over (released, or expired unrenewed);
    ``LeaseHeld`` if its driver renews it meanwhile."""
    seen, _ = _read(location)
    if seen is None or seen.holder == me or not seen.live(clock()):
        return
    say(f"lease: held by the driver on host {seen.holder.host} (pid {seen.holder.pid}, epoch "
        f"{seen.epoch}), unrenewed for {clock() - seen.renewed_at:.0f} s; waiting up to "
        f"{seen.expires_at - clock():.0f} s for it to expire (a live driver renews it before)")
    while True:
        sleep(min(_LOOK_EVERY_S, max(0.0, seen.expires_at - clock()) + 0.05))
        current, _ = _read(location)
        now = clock()
        decision = watch_for_takeover(seen, current, now)
        if decision == TAKE:
            return
        if decision == ALIVE:
            raise LeaseHeld(current, now, "It was renewed while this driver waited: that "
                            "driver is alive. Wait for it to finish, or take the run from it "
                            "with --takeover --force.")


def _read(location: RunLocation) -> tuple[Lease | None, str | None]:
    try:
        seen = read_versioned(location, LEASE)
    except FileNotFoundError:
        return None, None
    return Lease.from_json(seen.data, location.child_url(LEASE)), seen.version


def _taken_by(current: Lease | None, epoch: int) -> str:
    if current is None:
        return "its lease was deleted from the store"
    return (f"the driver on host {current.holder.host} (pid {current.holder.pid}) took it over "
            f"at epoch {current.epoch}")

