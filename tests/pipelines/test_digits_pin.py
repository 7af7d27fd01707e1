"""The digits results, pinned: a short run per mode gives exactly the rewards and final weights
that the reference commit computes on this same machine (``tests/golden``).

Refactors must not change what a run computes; this is where it would show. The runs go through
the in-process executor of the iteration program, in one subprocess
(``tests/golden/record_digits.py``) with torch, MKL and oneDNN held to their portable code paths;
the Dask driver runs the same program and is held to the in-process numbers by
``tests/pipelines/test_inprocess.py`` on moving weights. Some kernel still sums in another order on
another CPU, and machines of one vendor and vector width computed differently, so no recording
made elsewhere can judge this one: the expected values are the reference commit's, run in a git
work tree here and cached outside the repository under a key of the exact CPU and torch build
(``tests/golden/pin_reference.py``); ``SPOTLIGHT_PIN_RECOMPUTE=1`` ignores cache and shortcut.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from spotlight.config import PROJECT_ROOT
from tests.golden import pin_reference as pin
from tests.golden.pin_reference import MODES


@pytest.fixture(scope="module")
def expected() -> tuple[dict, str]:
    """The reference's results on this machine, and where they came from (for failures)."""
    try:
        return pin.expected_modes(recompute=os.environ.get("SPOTLIGHT_PIN_RECOMPUTE") == "1")
    except pin.ReferenceUnavailable as err:
        pytest.fail(str(err))


@pytest.fixture(scope="module")
def recorded() -> dict:
    return pin.run_recorder(PROJECT_ROOT, MODES)


# The first test's set-up runs the current code (three in-process runs of the pinned scenario)
# and, on a cache miss, the reference commit (the same three).
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_short_run_reproduces_the_recorded_digits_results(recorded, expected, mode):
    (modes, source), got = expected, recorded[mode]
    want = modes[mode]
    assert got["rollout_reward"] == want["rollout_reward"], f"expected from {source}"
    assert got["val_reward"] == want["val_reward"], f"expected from {source}"
    assert got["rewards_sha256"] == want["rewards_sha256"], f"expected from {source}"
    assert got["weights_sha256"] == want["weights_sha256"], f"expected from {source}"


# The key, the cache and the shortcut, checked without running anything.
CPU = ("processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
       "model name\t: AMD EPYC\nstepping\t: 1\nmicrocode\t: {micro}\nflags\t\t: {flags}\n\n")
FLAGS = "fpu sse sse2 avx avx2 fma"


def cpuinfo(micro: str = "0x1000065", flags: str = FLAGS) -> str:
    return "".join(CPU.format(n=n, micro=micro, flags=flags) for n in range(2))


def test_the_machine_key_follows_the_exact_cpu_build_commit_and_recorder():
    key = pin.machine_key(cpuinfo(), "2.13.0\nbuild", "d762f33", "recorder")
    assert key == pin.machine_key(cpuinfo(), "2.13.0\nbuild", "d762f33", "recorder")
    assert len(key) == 16 and int(key, 16) >= 0
    reordered = cpuinfo(flags=" ".join(reversed(FLAGS.split())))
    assert pin.machine_key(reordered, "2.13.0\nbuild", "d762f33", "recorder") == key
    for other in [(cpuinfo(micro="0x1000066"), "2.13.0\nbuild", "d762f33", "recorder"),
                  (cpuinfo(flags=FLAGS + " avx512f"), "2.13.0\nbuild", "d762f33", "recorder"),
                  (cpuinfo().replace("model\t\t: 1", "model\t\t: 17"), "2.13.0\nbuild",
                   "d762f33", "recorder"),
                  (cpuinfo(), "2.13.1\nbuild", "d762f33", "recorder"),
                  (cpuinfo(), "2.13.0\nbuild", "4f3b4cb", "recorder"),
                  (cpuinfo(), "2.13.0\nbuild", "d762f33", "recorder, edited")]:
        assert pin.machine_key(*other) != key, other


def test_the_cpu_identity_keeps_every_processors_values():
    assert pin.cpu_identity(cpuinfo())["microcode"] == "0x1000065"
    mixed = cpuinfo() + CPU.format(n=2, micro="0x1000066", flags=FLAGS)
    assert pin.cpu_identity(mixed)["microcode"] == "0x1000065 | 0x1000066"
    assert pin.cpu_identity("")["flags"] == ""


def test_the_cache_lives_outside_the_repository():
    assert pin.cache_dir({"SPOTLIGHT_PIN_CACHE": "/c"}) == Path("/c")
    assert pin.cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/spotlight/digits-pin")
    assert pin.cache_dir({}) == Path.home() / ".cache" / "spotlight" / "digits-pin"


def entry(key: str = "k") -> dict:
    mode = {"weights_sha256": "a" * 64, "rewards_sha256": "b" * 64, "val_reward": [0.125],
            "rollout_reward": [0.0]}
    return {"key": key, "modes": {m: dict(mode) for m in MODES}}


def test_a_cache_entry_is_whole_and_for_this_key_or_not_used():
    assert pin.entry_problem(entry(), "k") is None
    assert pin.entry_problem(entry(), "other") == "computed for key 'k', not 'other'"
    assert pin.entry_problem([], "k") == "not a JSON object but list"
    partial = entry()
    del partial["modes"]["sync"]
    assert pin.entry_problem(partial, "k") == "mode 'sync' missing"
    partial["modes"]["vanilla"]["val_reward"] = []
    assert pin.entry_problem(partial, "k").startswith("mode 'vanilla': val_reward missing")


def test_a_corrupt_or_partial_cache_file_is_recomputed_not_trusted(tmp_path):
    path = tmp_path / "k.json"
    assert pin.read_cached(path, "k") == (None, f"no cache file {path}")
    path.write_text('{"key": "k", "modes": {"spot')   # cut off mid-write
    got, why = pin.read_cached(path, "k")
    assert got is None and why.startswith(f"unreadable cache file {path}")
    path.write_text(json.dumps({"key": "k", "modes": {}}))
    assert pin.read_cached(path, "k") == (None, f"cache file {path}: mode 'spotlight' missing")
    pin.write_atomically(path, entry())
    assert pin.read_cached(path, "k") == (entry(), "")
    assert [p.name for p in tmp_path.iterdir()] == ["k.json"]   # no temporary file left


def test_a_shortcut_in_the_repository_serves_only_its_exact_key():
    golden = {"shortcuts": {"k": entry("k"), "bad": {"key": "bad", "modes": {}}}}
    assert pin.shortcut(golden, "k") == entry("k")
    assert pin.shortcut(golden, "other") is None and pin.shortcut(golden, "bad") is None
    recorded = json.loads(pin.GOLDEN.read_text())
    for key, shortcut in recorded.get("shortcuts", {}).items():
        assert pin.entry_problem(shortcut, key) is None, key
        assert shortcut["reference_commit"] == recorded["reference_commit"], key


def test_a_bad_cache_file_is_recomputed_and_recompute_ignores_a_good_one(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTLIGHT_PIN_CACHE", str(tmp_path))
    monkeypatch.setattr(pin, "this_machine", lambda: ("k", "d762f33", "", "2.13.0"))
    runs = []
    monkeypatch.setattr(pin, "compute_reference", lambda key, *_: runs.append(key) or entry(key))
    (tmp_path / "k.json").write_text("{")
    modes, source = pin.expected_modes()
    assert modes == entry()["modes"] and runs == ["k"] and "unreadable cache file" in source
    assert pin.read_cached(tmp_path / "k.json", "k") == (entry(), "")   # rewritten whole
    assert pin.expected_modes() == (entry()["modes"], f"the cache file {tmp_path / 'k.json'}")
    assert pin.expected_modes(recompute=True)[0] == entry()["modes"] and runs == ["k", "k"]


def test_without_the_reference_commit_the_pin_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(pin, "ROOT", tmp_path)   # not a git clone: nothing to check out
    with pytest.raises(pin.ReferenceUnavailable,
                       match=r"reference commit d762f33 computes on this machine \(key k\), but "
                             r"it could not be checked out \(.*\): run the tests from a git "
                             r"clone with history"):
        pin.compute_reference("k", "d762f33", "", "2.13.0")
