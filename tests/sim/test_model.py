"""The simulator's arithmetic, checked by hand."""
from __future__ import annotations

import math

import pytest

from spotlight.sim.config import TimingConfig
from spotlight.sim.model import (
    comm_init_seconds,
    exploration_quality,
    iteration_progress,
    iterations_to_target,
    pipelined_split,
    request_seconds,
    spread_ratio,
    step_seconds,
    train_seconds,
)

T = TimingConfig(step_s=0.5, batch_exponent=0.5, sp_degree=2, sp_speedup=1.6,
                 train_s_per_image=2.0, resume_s=0.25, comm_init_s_per_rank=3.0)


def test_step_and_request_seconds():
    assert step_seconds(T, 4) == pytest.approx(0.5 * 2 / 1.6)
    assert request_seconds(T, 4, 10) == pytest.approx(10 * 0.625)
    assert request_seconds(T, 4, 10, resume_step=6) == pytest.approx(4 * 0.625 + 0.25)
    assert request_seconds(T, 4, 10, resume_step=10) == pytest.approx(0.25)


def test_training_and_communicator():
    assert train_seconds(T, images=512, gpus=8) == 128.0
    assert comm_init_seconds(T, 1) == 0.0 and comm_init_seconds(T, 4) == 12.0


def test_spread_and_quality():
    assert spread_ratio(16, 16, 0.3) == 1.0
    assert spread_ratio(32, 16, 0.3) == pytest.approx(1 + 0.3 * math.log(2))
    assert exploration_quality(32, 32, 32, 16, 32) == 1.0
    assert exploration_quality(16, 32, 32, 16, 32) == 0.5
    # N = 24 against the reference 32, group 16: ln 1.5 / ln 2 of the effect
    assert exploration_quality(32, 32, 24, 16, 32) == pytest.approx(math.log(1.5) / math.log(2))
    assert exploration_quality(32, 32, 64, 16, 32) == 1.0     # beyond the measured: not counted
    assert exploration_quality(0, 32, 32, 16, 32) == 0.0


def test_progress_and_iterations_to_target():
    assert iteration_progress(2.0, 0.0) == 1.0 and iteration_progress(2.0, 0.5) == 1.5
    assert iterations_to_target([1.0] * 10, 10) == 10
    assert iterations_to_target([2.0] * 10, 10) == 5
    assert iterations_to_target([1.0, 2.0, 2.0], 4) == 3
    assert iterations_to_target([1.0] * 3, 10) is None


def test_pipelined_split_balances_the_slower_side():
    t = TimingConfig(train_s_per_image=1.0)
    # 8 GPUs, 100 images: training 100 GPU-s; a rollout of 300 GPU-s wants 6 of them
    # (50 s vs 50 s).
    assert pipelined_split(t, 8, 100, 300.0) == 6
