"""Spot capacity from a trace, and SP groups that break and regroup."""
from __future__ import annotations

import itertools

from spotlight.cost import CostLedger
from spotlight.scheduling.traces import SpotTrace
from spotlight.sim.clock import Clock
from spotlight.sim.config import SimConfig
from spotlight.sim.fleet import Fleet, capacity_changes, scaled_counts

TRACE = SpotTrace("t", ((0.0, 4), (10.0, 2), (20.0, 4)), 30.0)


def test_scaled_counts_shrink_and_grow():
    assert scaled_counts(TRACE, 2) == [(0.0, 2), (10.0, 1), (20.0, 2)]
    assert scaled_counts(TRACE, 8) == [(0.0, 8), (10.0, 4), (20.0, 8)]


def test_capacity_changes_replay_the_trace_faster_and_from_an_offset():
    counts = scaled_counts(TRACE, 4)
    assert list(itertools.islice(capacity_changes(counts, 30.0, 1.0, 0.0), 4)) == [
        (10.0, 2), (20.0, 4), (40.0, 2), (50.0, 4)]
    assert list(itertools.islice(capacity_changes(counts, 30.0, 10.0, 0.0), 2)) == [
        (1.0, 2), (2.0, 4)]
    assert list(itertools.islice(capacity_changes(counts, 30.0, 1.0, 15.0), 2)) == [
        (5.0, 4), (25.0, 2)]
    assert list(capacity_changes([(0.0, 3)], 30.0, 1.0, 0.0)) == []


class Recorder:
    def __init__(self):
        self.events = []

    def unit_ready(self, unit):
        self.events.append(("ready", unit.name))

    def unit_notice(self, unit):
        self.events.append(("notice", unit.name))

    def unit_lost(self, unit):
        self.events.append(("lost", unit.name))


def sp_fleet(elastic: bool) -> tuple[Clock, Fleet]:
    config = SimConfig().with_values({
        "cluster.ondemand_gpus": 2, "cluster.spot_ratio": 2.0, "cluster.notice_s": 0.0,
        "timing.sp_degree": 2, "timing.sp_speedup": 1.5, "timing.elastic_regroup_s": 0.5,
        "timing.peer_copy_s": 5.0, "timing.comm_init_s_per_rank": 2.0,
        "timing.process_start_s": 60.0})
    clock = Clock()
    trace = SpotTrace("t", ((0.0, 4), (10.0, 3), (100.0, 4)), 1000.0)
    return clock, Fleet(clock, config, spot=True, elastic=elastic, ledger=CostLedger(),
                        trace=trace)


def test_a_lost_member_breaks_its_group_and_elastic_survivors_regroup_at_once():
    clock, fleet = sp_fleet(elastic=True)
    clock.advance_to(1.0)   # groups of the first four GPUs form in 0.5 s
    assert len(fleet.ready_units("spot")) == 2
    recorder = Recorder()
    fleet.listeners.append(recorder)
    clock.advance_to(10.0)
    assert [e[0] for e in recorder.events] == ["lost"]
    # One survivor, no partner: no group until the newcomer at t=100 holds the weights
    # (60 s start + 5 s peer copy) and the pair regroups (0.5 s).
    clock.advance_to(165.4)
    assert len(fleet.ready_units("spot")) == 1
    clock.advance_to(165.5)
    assert len(fleet.ready_units("spot")) == 2


def test_without_persistence_survivors_reload_and_build_a_communicator():
    clock, fleet = sp_fleet(elastic=False)
    clock.advance_to(3.9)   # a group of 2 from scratch: 2 x 2 s of NCCL init
    assert fleet.ready_units("spot") == []
    clock.advance_to(4.0)
    assert len(fleet.ready_units("spot")) == 2
    clock.advance_to(168.9)   # newcomer ready at 165, + 4 s communicator
    assert len(fleet.ready_units("spot")) == 1
    clock.advance_to(169.0)
    assert len(fleet.ready_units("spot")) == 2
    assert fleet.preemptions == 1
