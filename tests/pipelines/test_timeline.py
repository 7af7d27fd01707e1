import pytest

from pipelines.front.timeline import (
    idle_share,
    merge_intervals,
    overlap_fraction,
    plot_timeline,
    stage_spans,
    worker_class,
)


def task(worker, stage, start, end, iteration=0, **extra):
    return {"worker": worker, "stage": stage, "start": start, "end": end, "iteration": iteration,
            **extra}


def test_merge_intervals():
    assert merge_intervals([(5, 8), (0, 2), (1, 3), (8, 9)]) == [(0, 3), (5, 9)]
    assert merge_intervals([]) == []
    assert merge_intervals([(0, 10), (2, 3)]) == [(0, 10)]


def test_overlap_fraction_exact():
    tasks = [
        task("gpu-0", "train", 10.0, 20.0),
        task("spot-0", "explore", 5.0, 15.0),    # 5 of 10 s inside
        task("spot-1", "explore", 12.0, 18.0),   # 6 of 6 s inside
        task("spot-0", "explore", 30.0, 34.0),   # 0 of 4 s inside
        task("gpu-0", "rollout", 0.0, 10.0),     # other stages do not count
    ]
    assert overlap_fraction(tasks) == pytest.approx(11.0 / 20.0, rel=1e-12)
    # the other way round: how much training was covered by exploration ([5, 18] of [10, 20])
    assert overlap_fraction(tasks, inner="train", outer="explore") == pytest.approx(0.8)
    # several outer stages count as their union: [0, 20] holds 10 + 6 of the 20 s
    assert overlap_fraction(tasks, outer=("rollout", "train")) == pytest.approx(16.0 / 20.0)


def test_overlap_fraction_counts_overlapping_train_windows_once():
    tasks = [
        task("gpu-0", "train", 0.0, 10.0, 0),
        task("gpu-1", "train", 5.0, 15.0, 0),    # union of train time is [0, 15]
        task("gpu-0", "train", 20.0, 30.0, 1),
        task("spot-0", "explore", 8.0, 12.0),    # fully inside the union: 4
        task("spot-0", "explore", 14.0, 22.0),   # [14, 15] + [20, 22]: 3 of 8
    ]
    assert overlap_fraction(tasks) == pytest.approx(7.0 / 12.0, rel=1e-12)


def test_overlap_fraction_edge_cases():
    assert overlap_fraction([]) == 0.0
    assert overlap_fraction([task("gpu-0", "train", 0.0, 10.0)]) == 0.0
    assert overlap_fraction([task("spot-0", "explore", 0.0, 10.0)]) == 0.0   # no training
    assert overlap_fraction([task("spot-0", "explore", 3.0, 3.0),
                             task("gpu-0", "train", 0.0, 10.0)]) == 0.0    # zero-length explore
    assert overlap_fraction([task("spot-0", "explore", 2.0, 4.0),
                             task("gpu-0", "train", 0.0, 10.0)]) == 1.0


def test_bad_tasks_are_refused():
    with pytest.raises(ValueError, match=r"task 0 lacks \['iteration'\]"):
        overlap_fraction([{"worker": "w", "stage": "train", "start": 0.0, "end": 1.0}])
    with pytest.raises(ValueError, match="task 0 .*ends at 1.0, before it starts at 2.0"):
        overlap_fraction([task("gpu-0", "train", 2.0, 1.0)])


def test_worker_class():
    assert worker_class(task("spot-3", "explore", 0, 1)) == "spot"
    assert worker_class(task("gpu-0", "train", 0, 1)) == "gpu"
    assert worker_class(task("tcp://10.0.0.1:1234", "train", 0, 1, worker_class="spot")) == "spot"


def test_plot_timeline_writes_a_png(tmp_path):
    tasks = []
    for k in range(2):
        t = 100.0 + 20.0 * k
        tasks += [task("gpu-0", "rollout", t, t + 4, k), task("gpu-0", "reward", t + 4, t + 5, k),
                  task("gpu-0", "advantages", t + 5, t + 5.5, k),
                  task("gpu-0", "train", t + 6, t + 14, k),
                  task("gpu-1", "train", t + 6, t + 13, k),
                  task("gpu-0", "checkpoint", t + 14, t + 15, k),
                  task("spot-0", "explore", t + 7, t + 12, k),
                  task("spot-10", "explore", t + 8, t + 16, k),
                  task("spot-2", "custom-stage", t + 1, t + 2, k)]
    tasks.append(task("gpu-0", "validation", 140.0, 143.0, 1))
    path = plot_timeline(tasks, tmp_path / "plots" / "timeline.png", title="two iterations")
    assert path == tmp_path / "plots" / "timeline.png"
    data = path.read_bytes()
    assert len(data) > 1000
    assert data[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_timeline_refuses_no_tasks(tmp_path):
    with pytest.raises(ValueError, match="no tasks to plot"):
        plot_timeline([], tmp_path / "t.png")


def test_rollout_spans_and_spot_idle_share_during_training():
    tasks = [task("gpu-0", "rollout", 0, 4), task("spot-0", "rollout", 1, 6),
             task("gpu-0", "train", 6, 10), task("gpu-0", "checkpoint", 10, 11),
             task("spot-0", "explore", 8, 10), task("spot-1", "explore", 6, 11),
             task("gpu-0", "rollout", 20, 22, iteration=1), task("gpu-0", "train", 22, 26,
                                                                   iteration=1)]
    assert stage_spans(tasks, "rollout") == {0: 6, 1: 2}
    # Training windows 6-11 and 22-26 (9 s); spot-0 busy 2 s of them, spot-1 5 s.
    assert idle_share([tasks]) == pytest.approx(1 - (2 + 5) / (9 * 2))
    assert idle_share([tasks], cls="gpu") == pytest.approx(0.0)
    no_spot = [t for t in tasks if not t["worker"].startswith("spot")]
    assert idle_share([no_spot]) is None
    # Two runs number their iterations alike: each run's windows are its own.
    later = [dict(t, start=t["start"] + 100, end=t["end"] + 100) for t in tasks]
    assert idle_share([tasks, later]) == pytest.approx(1 - (2 + 5) / (9 * 2))
    assert idle_share([tasks, no_spot]) == pytest.approx(1 - (2 + 5) / (9 * 2))
