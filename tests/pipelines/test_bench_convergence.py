"""The convergence bench's aggregation over seeds (the end-to-end run is in test_cli)."""
from __future__ import annotations

from pipelines.bench.convergence import _speedup, median_time


def test_median_time_counts_a_seed_that_never_arrived_as_the_slowest():
    assert median_time([300.0, 100.0, 200.0]) == 200.0
    assert median_time([100.0, None, 200.0]) == 200.0       # None sorts last, not first
    assert median_time([100.0, None, None]) is None          # the median seed never arrived
    assert median_time([100.0, 300.0]) == 200.0
    assert median_time([100.0, None]) is None                # halfway to "never" is never
    assert median_time([]) is None


def test_speedup_needs_both_times():
    assert _speedup(600.0, 300.0) == 2.0
    assert _speedup(None, 300.0) is None and _speedup(600.0, None) is None


def test_bench_refuses_unknown_or_repeated_modes_before_any_work():
    import pytest

    from pipelines.bench.convergence import bench_convergence

    with pytest.raises(ValueError, match=r"--modes vanilla,fast: each mode once"):
        bench_convergence(modes=["vanilla", "fast"])
    with pytest.raises(ValueError, match=r"each mode once"):
        bench_convergence(modes=["sync", "sync"])


def test_set_and_modes_are_refused_for_other_benchmarks(capsys):
    from spotlight import main

    assert main(["bench", "storage", "--set", "grpo.lr=1e-4"]) == 2
    assert "--set applies to 'bench convergence', 'overhead' and 'preemption'" in \
        capsys.readouterr().err
    assert main(["bench", "overhead", "--modes", "sync"]) == 2
    assert "--modes applies to 'bench convergence' only" in capsys.readouterr().err
