"""The digits pin's expected values: what the reference commit computes on this very machine.

Even on the portable code paths ``record_digits.py`` holds torch to, some kernel sums in an
order that follows the exact CPU: a coarse flavour such as ``AuthenticAMD-avx2`` named machines
that compute differently, and the pin failed by which machine CI drew. So the expected values are
the reference commit's, run here in a git work tree and cached outside the repository under a key
of everything that can move them: the CPU's identity (model, stepping, microcode, flags), the
torch build, the reference commit and the recorder. An entry in ``digits.json`` under exactly
this machine's key is a shortcut for that run, never a judge for another machine.

    python -m tests.golden.pin_reference            # this machine's key and cache file
    python -m tests.golden.pin_reference shortcut   # copy the cached entry into digits.json
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "digits.json"
RECORDER = ROOT / "tests" / "golden" / "record_digits.py"
MODES = ("spotlight", "vanilla", "sync")
CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "microcode", "flags")
MODE_FIELDS = {"weights_sha256": str, "rewards_sha256": str, "val_reward": list,
               "rollout_reward": list}
# Read by a fresh interpreter, as the recorder's is; numpy and python are cheap to add and a
# new one should recompute rather than be trusted. The first line is torch's version.
BUILD_PROBE = ("import sys, numpy, torch; print(torch.__version__); "
               "print(torch.__config__.show()); print('numpy', numpy.__version__); "
               "print('python', sys.version)")


class ReferenceUnavailable(RuntimeError):
    """The reference commit cannot be checked out here, so there is nothing to compare with."""


def cpu_identity(cpuinfo: str) -> dict[str, str]:
    """Each identifying /proc/cpuinfo field's distinct values over all processors (a mixed
    machine keeps them all); flags are sorted, so the kernel's order does not matter."""
    seen: dict[str, set[str]] = {field: set() for field in CPU_FIELDS}
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in seen:
            value = value.strip()
            seen[name.strip()].add(" ".join(sorted(value.split())) if name.strip() == "flags"
                                   else value)
    return {field: " | ".join(sorted(values)) for field, values in seen.items()}


def machine_key(cpuinfo: str, build: str, reference_commit: str, recorder: str) -> str:
    """The cache key: short sha256 over what decides the reference's numbers on a machine."""
    identity = {"cpu": cpu_identity(cpuinfo), "build": build, "reference_commit": reference_commit,
                "recorder_sha256": hashlib.sha256(recorder.encode()).hexdigest()}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``$SPOTLIGHT_PIN_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/spotlight/digits-pin``: outside
    the repository, so a fresh clone on the same machine reuses it."""
    if env.get("SPOTLIGHT_PIN_CACHE"):
        return Path(env["SPOTLIGHT_PIN_CACHE"])
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spotlight" / "digits-pin"


def entry_problem(entry: object, key: str) -> str | None:
    """Why ``entry`` cannot give the expected values for ``key``; None when it can."""
    if not isinstance(entry, dict):
        return f"not a JSON object but {type(entry).__name__}"
    if entry.get("key") != key:
        return f"computed for key {entry.get('key')!r}, not {key!r}"
    modes = entry.get("modes")
    for mode in MODES:
        got = modes.get(mode) if isinstance(modes, dict) else None
        if not isinstance(got, dict):
            return f"mode {mode!r} missing"
        for field, kind in MODE_FIELDS.items():
            if not isinstance(got.get(field), kind) or not got[field]:
                return f"mode {mode!r}: {field} missing or not a non-empty {kind.__name__}"
    return None


def read_cached(path: Path, key: str) -> tuple[dict | None, str]:
    """The entry cached at ``path`` if it is whole and for ``key``; else None and why not."""
    try:
        entry = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"no cache file {path}"
    except (OSError, ValueError) as err:   # a half-written or garbled file: recompute it
        return None, f"unreadable cache file {path} ({err})"
    problem = entry_problem(entry, key)
    return (None, f"cache file {path}: {problem}") if problem else (entry, "")


def write_atomically(path: Path, entry: dict) -> None:
    """Write ``entry`` so that a reader (another test run) sees the old file or all the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)   # mkstemp's 0600 would keep a CI cache shared by users unreadable
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def shortcut(golden: dict, key: str) -> dict | None:
    """The entry recorded in ``digits.json`` under exactly ``key``, if there is a whole one."""
    entry = golden.get("shortcuts", {}).get(key)
    return entry if entry is not None and entry_problem(entry, key) is None else None


def run_recorder(code_root: Path, modes: tuple[str, ...], executor: str = "inprocess") -> dict:
    """Run ``record_digits.py`` against the code under ``code_root`` with ``executor``
    (``inprocess`` or ``cluster``); its JSON lines, merged."""
    env = dict(os.environ, PYTHONPATH=str(code_root))
    done = subprocess.run([sys.executable, str(RECORDER), ",".join(modes), executor],
                          cwd=code_root, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{RECORDER.name} on {code_root} exited {done.returncode}:\n"
                           f"{done.stderr[-3000:]}")
    out: dict = {}
    for line in done.stdout.strip().splitlines():
        out.update(json.loads(line))
    return out


def compute_reference(key: str, commit: str, cpuinfo: str, build: str) -> dict:
    """Run the reference commit in a throw-away git work tree; the cache entry for ``key``."""
    git = ["git", "-C", str(ROOT), "worktree"]
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "reference"
        try:
            made = subprocess.run(git + ["add", "--detach", str(tree), commit],
                                  capture_output=True, text=True)
            error = (made.stderr.strip() or f"exit {made.returncode}") if made.returncode else ""
        except OSError as err:   # no git here
            error = str(err)
        if error:
            raise ReferenceUnavailable(
                f"the digits pin compares with what the reference commit {commit} computes on "
                f"this machine (key {key}), but it could not be checked out "
                f"({error}): run the tests from a git clone with history "
                f"(`git fetch --unshallow`), or put the entry computed on an identical machine "
                f"at {cache_dir() / f'{key}.json'}")
        try:
            modes = run_recorder(tree, MODES)
        finally:
            subprocess.run(git + ["remove", "--force", str(tree)], capture_output=True)
    return {"key": key, "reference_commit": commit, "cpu": cpu_identity(cpuinfo),
            "torch": build.splitlines()[0] if build else "",
            "computed": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "modes": {mode: modes[mode] for mode in MODES}}


def this_machine() -> tuple[str, str, str, str]:
    """(key, reference commit, cpuinfo text, build text) of this machine and checkout."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    # The recorder sets ATEN_CPU_CAPABILITY itself, so the user's setting must not move the key
    # (torch's config names the capability it runs with).
    env = {name: value for name, value in os.environ.items() if name != "ATEN_CPU_CAPABILITY"}
    build = subprocess.run([sys.executable, "-c", BUILD_PROBE], capture_output=True, text=True,
                           env=env, timeout=300, check=True).stdout
    commit = json.loads(GOLDEN.read_text())["reference_commit"]
    return machine_key(cpuinfo, build, commit, RECORDER.read_text()), commit, cpuinfo, build


def expected_modes(recompute: bool = False) -> tuple[dict, str]:
    """The reference's results on this machine, and where they came from: the shortcut in
    ``digits.json``, the cache, or (``recompute``, or neither has a whole entry) a fresh run."""
    key, commit, cpuinfo, build = this_machine()
    path = cache_dir() / f"{key}.json"
    why = "SPOTLIGHT_PIN_RECOMPUTE=1"
    if not recompute:
        entry = shortcut(json.loads(GOLDEN.read_text()), key)
        if entry is not None:
            return entry["modes"], f"the shortcut for key {key} in {GOLDEN}"
        entry, why = read_cached(path, key)
        if entry is not None:
            return entry["modes"], f"the cache file {path}"
    entry = compute_reference(key, commit, cpuinfo, build)
    write_atomically(path, entry)
    return entry["modes"], f"the reference commit run here, now cached at {path} ({why})"


def main(argv: list[str]) -> int:
    key, _, _, _ = this_machine()
    path = cache_dir() / f"{key}.json"
    print(f"key {key}, cache file {path}")
    if argv == ["shortcut"]:
        entry, why = read_cached(path, key)
        if entry is None:
            print(f"nothing to copy: {why}; run tests/pipelines/test_digits_pin.py first")
            return 1
        golden = json.loads(GOLDEN.read_text())
        golden.setdefault("shortcuts", {})[key] = entry
        GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
        print(f"added the shortcut for key {key} to {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
