"""Terminal view of a run: a progress bar per iteration's stages and one line per iteration."""
from __future__ import annotations

import sys
from typing import Any

STAGES = ("rollout", "train", "validation")


def iteration_line(result: Any) -> str:
    """The one line a user reads per iteration."""
    val = f"{result.val_reward:.3f}" if result.val_reward is not None else "  -  "
    explore = f"{result.explored}/{result.planned}" if result.planned else "-"
    if result.filled:
        explore += f" (+{result.filled} random)"
    resumed = f" resumed[{','.join(result.resumed_stages)}]" if result.resumed_stages else ""
    if getattr(result, "preemptions", 0):
        resumed += f"  preempted {result.preemptions}x (resumed)"
    # The audit τ (random candidates) decides the fallback; τ over the selected seeds is biased
    # upwards by the selection and shown for reference only.
    audit, tau = getattr(result, "audit_tau", None), getattr(result, "kendall_tau", None)
    fidelity = f"  tau audit {audit:+.2f}" if audit is not None else ""
    fidelity += f"  tau selected {tau:+.2f}" if tau is not None else ""
    if getattr(result, "fidelity_state", "trusting") == "fallback":
        fidelity += " FALLBACK (stale ranking untrusted)"
    # The rollout reward of a mode that selects seeds is over selected seeds, so it is not
    # comparable across modes; the validation reward (fixed seeds, no selection) is.
    return (f"iter {result.iteration:4d}  val {val}  rollout {result.reward_mean:.3f}  "
            f"group std {result.group_reward_std:.3f}  explore {explore}{fidelity}  "
            f"{result.wall_s:5.1f}s  cost ${result.cost_total_usd:.4f}{resumed}")


def dask_log_line(session: Any) -> str | None:
    """Where the embedded cluster's own Dask messages go, said once when that is not inside the
    run (a run on object storage); a run on a local file system keeps them in RUN/logs/."""
    path = session.dask_log
    if path is None or session.url.startswith("file://"):
        return None
    return f"dask log: {path} (Dask's own messages)"


def dashboard_line(session: Any) -> str:
    """Dask's dashboard and its Spotlight tab (served where the scheduler preloads
    pipelines.observe.dashboard_page, as the embedded one does)."""
    link = session.dashboard_link
    if not link:
        return "dashboard: not available"
    base = link[: -len("/status")] if link.endswith("/status") else link.rstrip("/")
    return f"dashboard: {link}  (this run live: {base}/spotlight)"


def preemption_line(kind: str, info: dict) -> str | None:
    """What an operator on spot capacity needs to hear, as it happens (None: nothing to say)."""
    if kind == "dispatch" and info.get("what") == "starved":
        return (f"spot: no spot worker left; {info['waiting']} {info.get('stage', '')} requests "
                f"wait (up to {info['wait_s']:g} s, then their seeds are random)")
    if kind == "dispatch" and info.get("what") == "gave_up":
        return f"spot: gave up waiting: {info['reason']}"
    if kind == "dispatch" and info.get("what") == "silent":
        how = "no heartbeat" if info.get("by") == "heartbeat" else "no committed step"
        return (f"cut off: {info['worker']} ({how} for {info['silent_s']:.0f} s); its requests "
                "resume elsewhere from their last committed step")
    if kind == "dispatch" and info.get("what") == "unheard":
        return (f"silent: {info['worker']} (no heartbeat for {info['silent_s']:.0f} s) while "
                f"{info['waiting'] or 'a task'} waits on it; if it comes back the task finishes "
                "there, if it is gone Dask runs it elsewhere once it drops the worker")
    if kind == "dispatch" and info.get("what") == "rejoined":
        return f"rejoined: {info['worker']} is heard from again"
    if kind == "injector" and info.get("kind") in ("kill", "notice", "start", "no_spot_left",
                                                    "injector_error"):
        what = {"kill": "SIGKILL (no notice)", "notice": "SIGTERM notice", "start": "started",
                "no_spot_left": "the trace removes every spot worker",
                "injector_error": f"injector failed: {info.get('error')}"}[info["kind"]]
        return f"inject: {info.get('worker', '')} {what}".replace("  ", " ")
    if kind == "preemptions":
        s = info["summary"]
        return (f"spot: {info['stage']}: {s['preemptions_hard']} hard + "
                f"{s['preemptions_graceful']} graceful preemptions, {s['finished']}/"
                f"{s['requests']} requests finished"
                + (f" ({s['gave_up']})" if s["gave_up"] else ""))
    return None


def lease_line(info: dict) -> str:
    """``lease: epoch 2 (took over from host a pid 11, epoch 1)`` for a driver's lease event."""
    taken = info.get("took_over_from")
    if not taken:
        return f"lease: epoch {info['epoch']}"
    return (f"lease: epoch {info['epoch']} (took over from host {taken['host']} pid "
            f"{taken['pid']}, epoch {taken['epoch']})")


class ConsoleProgress:
    """An ``on_event`` callback for :class:`pipelines.front.session.Session` that draws with
    tqdm."""

    def __init__(self, stream=None, bars: bool = True) -> None:
        self.stream = stream or sys.stderr
        self.bars = bars and self.stream.isatty()
        self._bar = None
        self._iteration = None

    def __call__(self, kind: str, info: dict) -> None:
        if kind == "stage_start":
            self._stage(info["iteration"], info["stage"])
        elif kind == "fidelity":
            self._close()
            print(f"rank fidelity: {info['decision'].reason}", file=self.stream, flush=True)
        elif kind in ("dispatch", "injector", "preemptions"):
            line = preemption_line(kind, info)
            if line:
                self._close()
                print(line, file=self.stream, flush=True)
        elif kind == "lease":
            self._close()
            print(lease_line(info), file=self.stream, flush=True)
        elif kind == "iteration_done":
            self._close()
            print(iteration_line(info["result"]), flush=True)

    def _stage(self, iteration: int, stage: str) -> None:
        if not self.bars:
            return
        from tqdm import tqdm

        if self._iteration != iteration:
            self._close()
            self._bar = tqdm(total=len(STAGES), desc=f"iter {iteration}", file=self.stream,
                             leave=False, bar_format="{desc}: {n}/{total} stages |{bar}| {postfix}")
            self._iteration = iteration
        if stage in STAGES and self._bar is not None:
            self._bar.n = STAGES.index(stage)
            self._bar.set_postfix_str(stage)

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            self._iteration = None
