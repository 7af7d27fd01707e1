"""LatentSink: commit denoising-step latents off the critical path.

``commit`` validates and copies the latent into a bounded queue (blocking when it is full, so
memory stays bounded) and returns. A latent on a CUDA device is copied into pinned host memory
without waiting for the device (the background thread waits for that copy instead), so a
denoising loop on the GPU never stalls on streaming. One background thread drains the queue in
batches: it writes a batch's chunks concurrently, then the touched requests' commit markers --
always after the chunks they cover, so commits stay ordered per request. ``flush`` waits until
everything queued is committed and re-raises the first background error; after an error the sink
is failed and refuses further work (what was committed before stays committed and readable).

Markers are coalesced: a request's marker is written at most ``commit_interval_s`` after the
first chunk it does not yet cover (at once for a request's final step, and on ``flush`` and
``close``). A request streaming one step per tenth of a second then costs one object write per
step plus a few markers, instead of two writes per step; a preemption loses at most the
uncovered steps of that interval, which the resumed request recomputes identically.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from .attempts import FIRST, Attempt
from .errors import CorruptObjectError, SinkClosedError, StorageError
from .latents import Labels, LatentStreams, request_key
from .manifest import stage_key

_STOP = object()
_FLUSH = object()  # write every due-or-not marker, then count as done (see flush())
_IO_THREADS = 8  # concurrent object writes per batch; object stores reward parallel PUTs


class _Item(NamedTuple):
    stage: str
    request: str
    step: int
    latent: np.ndarray
    num_steps: int
    weights_version: int
    labels: Labels | None = None
    attempt: Attempt = FIRST


class _Stream:
    """Per-request state of the background thread: the array its attempt writes, its marker
    and that marker's stored version (the next marker write is conditional on it)."""

    __slots__ = ("array", "name", "record", "version", "next_step")

    def __init__(self, array: Any, name: str, record: dict, version: str) -> None:
        self.array, self.name, self.record, self.version = array, name, record, version
        self.next_step = int(record["step"]) + 1


class LatentSink:
    """Asynchronous, ordered, bounded committer of latents for one run (and a default stage)."""

    def __init__(self, streams: LatentStreams, stage: str | None = None, *, queue_size: int = 64,
                 commit_interval_s: float = 0.0):
        self.streams = streams
        self.stage = stage_key(stage) if stage is not None else None
        self.commit_interval_s = float(commit_interval_s)
        # Requests whose written chunks no marker covers yet: key -> (marker due at, last item).
        self._uncovered: dict[tuple[str, str], tuple[float, _Item]] = {}
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._max_batch = queue_size
        self._cond = threading.Condition()
        self._pending = 0
        self._error: BaseException | None = None
        self._closed = False
        self._expected: dict[tuple[str, str], tuple[int, tuple, np.dtype]] = {}
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._stages: set[str] = set()
        self._pool = ThreadPoolExecutor(_IO_THREADS, thread_name_prefix="spotlight-sink-io")
        self._thread = threading.Thread(target=self._run, name="spotlight-latent-sink", daemon=True)
        self._thread.start()

    # -- caller side --------------------------------------------------------------------------
    def commit(self, request: str | int, step: int, latent: Any, *, num_steps: int,
               weights_version: int, stage: str | None = None,
               labels: Labels | None = None, attempt: Attempt = FIRST) -> None:
        """Queue the latent of ``step`` (0 = initial noise) of ``request`` and return (blocks
        only while the queue is full). A request's steps must come in order without gaps,
        starting at 0 or right after its committed step (see ``resume_point``). ``labels``
        (dim names, coordinates) are written with a new request's first step; once its last
        step is committed, the request is sealed (:meth:`LatentStreams.seal`). ``attempt``
        (the dispatcher's) owns the request from its first commit on; once a newer attempt
        claims the request, this one's next commit raises StreamOvertakenError."""
        self._raise_if_failed()
        if self._closed:
            raise SinkClosedError("commit() on a closed LatentSink; open a new sink")
        stage = stage_key(stage) if stage is not None else self.stage
        if stage is None:
            raise ValueError("commit() needs stage=... (this sink was opened without a stage)")
        request = request_key(request)
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) \
                or not 0 <= step <= num_steps:
            raise ValueError(f"step {step!r} of request {request!r} must be an int in "
                             f"[0, num_steps={num_steps}]")
        latent = _as_array(latent, request, int(step))
        key = (stage, request)
        expected = self._expected.get(key)
        if expected is not None:
            if int(step) != expected[0]:
                raise ValueError(f"request {request!r}: step {step} committed after step "
                                 f"{expected[0] - 1}; steps must be consecutive")
            if latent.shape != expected[1] or latent.dtype != expected[2]:
                raise ValueError(f"request {request!r}: step {step} latent is {latent.shape} "
                                 f"{latent.dtype}, earlier steps were {expected[1]} {expected[2]}")
        self._expected[key] = (int(step) + 1, latent.shape, latent.dtype)
        with self._cond:
            self._pending += 1
        self._queue.put(_Item(stage, request, int(step), latent, int(num_steps),
                              int(weights_version), labels, Attempt(*attempt)))

    def flush(self, timeout: float | None = None) -> None:
        """Block until every queued latent is committed; re-raise a background error."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._raise_if_failed()
        if not self._closed:  # ask the thread to write the markers it holds back
            with self._cond:
                self._pending += 1
            try:
                self._queue.put(_FLUSH, timeout=timeout)
            except queue.Full:
                with self._cond:
                    self._pending -= 1
                raise TimeoutError(f"LatentSink.flush: the queue stayed full for {timeout}s")
        with self._cond:
            while self._pending and self._error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"LatentSink.flush: {self._pending} latents still "
                                       f"uncommitted after {timeout}s")
                self._cond.wait(left)
        self._raise_if_failed()

    def close(self, *, raise_errors: bool = True) -> None:
        """Commit what is queued, stop the background thread, re-raise a background error."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()
            self._pool.shutdown(wait=True)
        if raise_errors:
            self._raise_if_failed()

    @property
    def error(self) -> BaseException | None:
        """The background error that failed this sink, if any."""
        return self._error

    def __enter__(self) -> "LatentSink":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        self.close(raise_errors=exc_type is None)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    # -- background thread --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._take()
            work = [item for item in batch if isinstance(item, _Item)]
            forced = any(item is _FLUSH or item is _STOP for item in batch)
            if self._error is None:
                try:
                    self._write_batch(work)
                    self._write_markers(forced)
                except _ItemError as failed:
                    self._fail(_wrap(failed.cause, failed.item,
                                     self.streams.url(failed.item.stage, failed.item.request)))
                except BaseException as exc:  # noqa: BLE001 - never let flush() wait forever
                    error = StorageError(f"latent sink failed: {type(exc).__name__}: {exc}")
                    error.__cause__ = exc
                    self._fail(error)
            with self._cond:
                self._pending -= sum(1 for item in batch if item is not _STOP)
                self._cond.notify_all()
            if batch and batch[-1] is _STOP:
                return

    def _take(self) -> list:
        """The next batch from the queue; [] when a held-back marker falls due first."""
        timeout = None
        if self._uncovered:
            timeout = max(0.0, min(due for due, _ in self._uncovered.values()) - time.monotonic())
        try:
            batch = [self._queue.get(timeout=timeout)]
        except queue.Empty:
            return []
        while len(batch) < self._max_batch and batch[-1] is not _STOP:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._uncovered.clear()

    def _write_batch(self, work: list[_Item]) -> None:
        if not work:
            return
        work = [it._replace(latent=_arrived(it.latent)) for it in work]
        # 1. Open (or create) the arrays of requests first seen in this batch, concurrently.
        first: dict[tuple[str, str], _Item] = {}
        for item in work:
            key = (item.stage, item.request)
            if key not in self._streams and key not in first:
                first[key] = item
        for stage in {stage for stage, _ in first} - self._stages:
            try:
                self.streams.prepare_stage(stage)
            except BaseException as exc:  # noqa: BLE001
                raise _ItemError(next(it for it in first.values() if it.stage == stage), exc)
            self._stages.add(stage)
        self._parallel(list(first.values()), self._open_stream)
        # 2. Check the order against what is committed, then write all chunks concurrently.
        for item in work:
            stream = self._streams[(item.stage, item.request)]
            if item.step != stream.next_step:
                raise _ItemError(item, StorageError(
                    f"the stream continues at step {item.step} but the store has committed "
                    f"through step {stream.next_step - 1}; resume from resume_point() (step "
                    f"{stream.next_step - 1}) and commit step {stream.next_step}"))
            stream.next_step += 1
        def write(it: _Item) -> None:
            stream = self._streams[(it.stage, it.request)]
            self.streams.write_step(stream.array, it.stage, it.request, it.step, it.latent,
                                    stream.name)

        self._parallel(work, write)
        # 3. Only now may markers cover these steps: due at once for a finished request, else
        #    commit_interval_s after the first step no marker covers yet.
        now = time.monotonic()
        for item in work:
            key = (item.stage, item.request)
            due = self._uncovered[key][0] if key in self._uncovered else \
                now + self.commit_interval_s
            if item.step >= item.num_steps:
                due = now
            self._uncovered[key] = (due, item)

    def _write_markers(self, forced: bool) -> None:
        """One commit marker per request that is due (all of them if ``forced``)."""
        now = time.monotonic()
        due = [item for at, item in self._uncovered.values() if forced or at <= now]
        for item in due:
            record = self._streams[(item.stage, item.request)].record
            record["step"], record["updated_at"] = item.step, time.time()
        self._parallel(due, self._write_marker)
        self._parallel([it for it in due if it.step >= it.num_steps],
                       lambda it: self.streams.seal(it.stage, it.request))
        for item in due:
            del self._uncovered[(item.stage, item.request)]

    def _write_marker(self, item: _Item) -> None:
        """Write a request's marker if this attempt still owns the request (a conditional write
        on the version it last wrote); StreamOvertakenError once a newer attempt claimed it."""
        stream = self._streams[(item.stage, item.request)]
        stream.version = self.streams.write_commit(item.stage, item.request, stream.record,
                                                   stream.version)

    def _parallel(self, items: list[_Item], fn: Any) -> None:
        """Run ``fn`` on every item concurrently; raise the first failure in item order."""
        if len(items) == 1:  # the common case of a steady stream: no hop to a pool thread
            try:
                fn(items[0])
            except BaseException as exc:  # noqa: BLE001 - reported like a pool failure
                raise _ItemError(items[0], exc)
            return
        futures = [self._pool.submit(fn, it) for it in items]
        for item, future in zip(items, futures):
            exc = future.exception()
            if exc is not None:
                for f in futures:
                    f.cancel()
                raise _ItemError(item, exc)

    def _open_stream(self, item: _Item) -> None:
        """Claim the request for the item's attempt (:meth:`LatentStreams.claim`), then open
        the array it writes."""
        claim = self.streams.claim(item.stage, item.request, item.attempt, item.step, {
            "request": item.request, "stage": item.stage, "num_steps": item.num_steps,
            "weights_version": item.weights_version, "shape": list(item.latent.shape),
            "dtype": str(item.latent.dtype), "updated_at": time.time()})
        record = claim.record
        last = int(record["step"])
        record["resumes"] = list(record.get("resumes", [])) + ([last] if last >= 0 else [])
        # (picked up after an interruption: recorded where)
        arr = self.streams.open_for_write(
            item.stage, item.request, num_steps=item.num_steps, shape=item.latent.shape,
            dtype=item.latent.dtype, weights_version=item.weights_version, fresh=claim.new_array,
            labels=item.labels, array=claim.array, group=last < 0)
        self._streams[(item.stage, item.request)] = _Stream(arr, claim.array, record,
                                                            claim.version)


class _ItemError(Exception):
    def __init__(self, item: _Item, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.item, self.cause = item, cause


class _DeviceCopy:
    """A latent on its way from a CUDA device into pinned host memory: ``array`` is the host
    buffer (shape and dtype are known at once), readable once :meth:`wait` has returned."""

    def __init__(self, tensor: Any) -> None:
        import torch  # only ever reached with a CUDA tensor, when torch is loaded

        # Non-blocking to the host lands in pinned memory; the event marks the copy's end on
        # the stream the step loop runs on (later kernels there may reuse the source).
        self.host = tensor.detach().to("cpu", non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record(torch.cuda.current_stream(tensor.device))
        self.array = self.host.numpy()
        self.shape, self.dtype = self.array.shape, self.array.dtype

    def wait(self) -> np.ndarray:
        self.event.synchronize()
        return self.array


def _arrived(latent: Any) -> np.ndarray:
    """A queued latent as a host array (waiting for its device copy if it is one)."""
    return latent.wait() if isinstance(latent, _DeviceCopy) else latent


def _as_array(latent: Any, request: str, step: int) -> np.ndarray | _DeviceCopy:
    kind = type(latent).__name__
    try:
        if getattr(latent, "is_cuda", False) and latent.dtype.is_floating_point \
                and latent.dtype.itemsize >= 4:
            return _DeviceCopy(latent)   # fresh pinned memory of its own: no copy below
        if hasattr(latent, "detach"):  # a torch tensor, without importing torch
            latent = latent.detach().cpu().numpy()  # a view; copied just below
        arr = np.array(latent, copy=True, order="C")  # the caller may reuse its buffer
    except Exception as exc:  # noqa: BLE001
        raise TypeError(f"request {request!r} step {step}: latent of type {kind} "
                        "cannot become a numpy array; pass float32 numpy or a CPU float tensor "
                        "(bf16: .float() first)") from exc
    if arr.dtype.kind not in "fiu" or arr.ndim == 0:
        raise TypeError(f"request {request!r} step {step}: latent must be a numeric array with "
                        f"at least one dimension, got {arr.dtype} of shape {arr.shape}")
    return arr


def _wrap(exc: BaseException, item: _Item, url: str) -> BaseException:
    """The error flush() raises: says which request and step, keeps the original as cause."""
    if isinstance(exc, CorruptObjectError):
        return exc
    where = f"latent sink: request {item.request!r} step {item.step} ({url})"
    if isinstance(exc, StorageError):
        err: BaseException = type(exc)(f"{where}: {exc}")
    else:
        err = StorageError(f"{where}: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err
