"""What bench convergence refuses before any work (the end-to-end run is in test_cli, the
figures in test_convergence_report)."""
from __future__ import annotations

import pytest

from pipelines.bench.convergence import bench_convergence


def test_bench_refuses_unknown_or_repeated_modes_before_any_work():
    with pytest.raises(ValueError, match=r"--modes vanilla,fast: each mode once"):
        bench_convergence(modes=["vanilla", "fast"])
    with pytest.raises(ValueError, match=r"each mode once"):
        bench_convergence(modes=["sync", "sync"])
    with pytest.raises(ValueError, match=r"each mode once"):
        bench_convergence(modes=["vanilla", "planned"])   # the old name of spotlight


def test_a_budget_off_the_validations_is_refused(monkeypatch):
    import pipelines.bench.convergence as convergence

    monkeypatch.setattr(convergence, "base_validation", lambda config: pytest.fail("ran"))
    for budget in (7, 35):   # not a multiple of 5; past --iterations 30
        with pytest.raises(ValueError, match=rf"--budget {budget} must be a multiple"):
            bench_convergence(budget=budget)


def test_set_and_modes_are_refused_for_other_benchmarks(capsys):
    from spotlight import main

    assert main(["bench", "storage", "--set", "grpo.lr=1e-4"]) == 2
    assert "--set applies to 'bench convergence', 'arms', 'overhead', 'preemption', 'faults' " \
        "and 'simulate' only" in capsys.readouterr().err
    assert main(["bench", "overhead", "--modes", "sync"]) == 2
    assert "--modes applies to 'bench convergence' only" in capsys.readouterr().err


@pytest.mark.parametrize("task,target,goal", [("ocr", None, 0.32), ("geneval", None, 0.35),
                                              ("geneval", 0.4, 0.4)])
def test_the_default_target_is_the_base_plus_the_tasks_gain(monkeypatch, task, target, goal):
    import pipelines.bench.convergence as convergence
    import pipelines.bench.shipped as shipped

    class Planned(Exception):
        pass

    def stop(folder, plan, resume):
        raise Planned(plan.target)

    monkeypatch.setattr(convergence, "base_validation", lambda config: (0.3, 0.004))
    monkeypatch.setattr(shipped, "_build", lambda config: None)   # no base pretrained for this
    monkeypatch.setattr(convergence.PairedStore, "open", staticmethod(stop))
    with pytest.raises(Planned) as planned:
        bench_convergence(task=task, target=target)
    assert planned.value.args[0] == pytest.approx(goal)
