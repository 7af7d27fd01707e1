import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from spotlight.scheduling.traces import (
    ReplayEvent,
    SpotTrace,
    TraceError,
    choose_victims,
    initial_count,
    load_trace,
    longest_outage_s,
    poisson_trace,
    replay_period_s,
    replay_schedule,
    scale_to_cap,
)

# The opening of the shipped us-east-2b trace: 5-minute ticks of 16 requested p3 nodes.
AWS_OPENING = [0, 0, 0, 3, 3, 3, 3, 7, 7, 7, 9, 9, 9, 7, 7, 7, 7, 16, 16, 16, 6, 6, 6, 6] + \
    [16] * 20 + [11] * 4 + [16] * 10 + [14] * 3 + [16] * 4 + [12] * 3 + [16] * 11 + [10] * 3 + \
    [16] * 7 + [0] * 3 + [16] * 4 + [2] * 3 + [16] * 4 + [12] * 3 + [16] * 7 + [14] * 3 + \
    [16] * 7 + [0] * 7 + [12] * 3 + [16] * 30


def _trace_dir() -> Path:
    """The shared spot traces ($SPOTLIGHT_TRACES, else ../shared/traces beside the repo); where
    they are not, files of the same names and formats holding their opening stretch."""
    env = os.environ.get("SPOTLIGHT_TRACES")
    beside_the_repo = Path(__file__).resolve().parents[3] / "shared" / "traces"
    for candidate in ([Path(env)] if env else []) + [beside_the_repo]:
        if (candidate / "g4dn-events.csv").is_file():
            return candidate
    root = Path(tempfile.mkdtemp(prefix="spotlight-traces-"))
    for name, data in (("aws-p3-16node-availability-us-east-2b.json", AWS_OPENING),
                       ("aws-p3-16node-availability-us-west-2a.json", AWS_OPENING[::-1])):
        (root / name).write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": data}))
    rows, up = [], []
    for i in range(24):
        rows.append(f"{480000 + 60000 * i},add,node{i}")
        up.append(f"node{i}")
        if i % 3 == 2:
            rows.append(f"{500000 + 60000 * i},remove,{up.pop(0)}")
    (root / "g4dn-events.csv").write_bytes(("\r\n".join(rows) + "\r\n").encode())
    return root


TRACES = _trace_dir()
AWS_EAST = TRACES / "aws-p3-16node-availability-us-east-2b.json"
AWS_WEST = TRACES / "aws-p3-16node-availability-us-west-2a.json"
G4DN = TRACES / "g4dn-events.csv"


def write(tmp_path, text, name="trace.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def sign(x):
    return (x > 0) - (x < 0)


# --- parsing the shipped traces -----------------------------------------------------------------

def test_aws_count_trace_matches_the_raw_data():
    raw = json.loads(AWS_EAST.read_text())
    gap, data = raw["metadata"]["gap_seconds"], raw["data"]
    trace = load_trace(AWS_EAST)
    assert trace.peak == 16
    assert trace.duration_s == len(data) * gap
    assert trace.counts[0] == (0.0, data[0])
    for i, count in enumerate(data):
        assert trace.count_at(i * gap) == count
        assert trace.count_at(i * gap + gap / 2) == count
    # only changes are kept
    assert all(a[1] != b[1] for a, b in zip(trace.counts, trace.counts[1:]))
    assert len(trace.counts) == 1 + sum(a != b for a, b in zip(data, data[1:]))


def test_g4dn_event_trace_counts_follow_the_rows():
    rows = [line.strip().split(",") for line in G4DN.read_text().splitlines() if line.strip()]
    adds = sum(r[1] == "add" for r in rows)
    removes = sum(r[1] == "remove" for r in rows)
    trace = load_trace(G4DN)
    assert trace.duration_s == int(rows[-1][0]) / 1000
    assert trace.counts[0] == (0.0, 0)
    assert trace.count_at(trace.duration_s) == adds - removes
    # after all the rows at each time, the count is the running number of adds minus removes
    running = 0
    for i, (ms, action, _) in enumerate(rows):
        running += 1 if action == "add" else -1
        if i + 1 == len(rows) or rows[i + 1][0] != ms:
            assert trace.count_at(int(ms) / 1000) == running
    assert trace.count_at(int(rows[0][0]) / 1000 - 1) == 0


def test_format_is_detected_by_content_not_extension(tmp_path):
    counts = load_trace(write(tmp_path, '{"metadata": {"gap_seconds": 10}, "data": [1, 1, 2]}',
                              "looks.csv"))
    assert counts.counts == ((0.0, 1), (20.0, 2)) and counts.duration_s == 30.0
    events = load_trace(write(tmp_path, "0,add,a\n1500,add,b\n3000,remove,a\n", "looks.json"))
    assert events.counts == ((0.0, 1), (1.5, 2), (3.0, 1)) and events.duration_s == 3.0


def test_csv_with_header_crlf_and_simultaneous_events(tmp_path):
    path = write(tmp_path, "ms,action,node\r\n1000,add,n1\r\n1000,add,n2\r\n2000,remove,n1\r\n"
                           "2000,add,n1\r\n4000,remove,n2\r\n")
    trace = load_trace(path)
    # the remove+add of n1 at 2 s nets to no change and leaves no entry
    assert trace.counts == ((0.0, 0), (1.0, 2), (4.0, 1))
    assert trace.source == str(path)


@pytest.mark.parametrize("text, line, words", [
    ("0,add,n1\n10,launch,n2\n", 2, "launch"),
    ("0,add,n1\n10,add\n", 2, "2 field"),
    ("0,add,n1\n10,add,n2,extra\n", 2, "4 field"),
    ("0,add,n1\n50,add,n2\n20,remove,n1\n", 3, "backwards"),
    ("0,add,n1\n10,remove,n2\n", 2, "not up"),
    ("0,add,n1\n10,add,n1\n", 2, "already up"),
    ("-5,add,n1\n", 1, ">= 0"),
    ("0,add,n1\n-5,add,n2\n", 2, ">= 0"),
    ("0,add,n1\nms,action,node\n", 2, "not a number"),
    ("0,add,n1\n\n10,remove,n1\nx,add,n1\n", 4, "not a number"),
])
def test_malformed_csv_rows_are_rejected_with_their_line(tmp_path, text, line, words):
    path = write(tmp_path, text, "bad.csv")
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert f"{path}:{line}:" in str(err.value)
    assert words in str(err.value)


@pytest.mark.parametrize("text", ["", "  \n\n", "milliseconds,action,node\n"])
def test_empty_csv_is_rejected(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(TraceError, match="empty file|no events") as err:
        load_trace(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("doc, words", [
    ({"metadata": {"gap_seconds": 300}}, "'data'"),
    ({"metadata": {"gap_seconds": 300}, "data": []}, "'data'"),
    ({"metadata": {}, "data": [1]}, "gap_seconds"),
    ({"data": [1]}, "gap_seconds"),
    ({"metadata": {"gap_seconds": 0}, "data": [1]}, "> 0"),
    ({"metadata": {"gap_seconds": -300}, "data": [1]}, "> 0"),
    ({"metadata": {"gap_seconds": True}, "data": [1]}, "gap_seconds"),
    ({"metadata": {"gap_seconds": 300}, "data": [1, 2, -1]}, "data[2]"),
    ({"metadata": {"gap_seconds": 300}, "data": [1, 2.5]}, "data[1]"),
    ({"metadata": {"gap_seconds": 300}, "data": [1, True]}, "data[1]"),
    ({"metadata": {"gap_seconds": 300}, "data": ["3"]}, "data[0]"),
    ([1, 2, 3], "'data'"),
])
def test_malformed_json_is_rejected(tmp_path, doc, words):
    path = write(tmp_path, json.dumps(doc), "bad.json")
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(path) in str(err.value) and words in str(err.value)


def test_invalid_json_reports_its_line(tmp_path):
    path = write(tmp_path, '{"metadata": {"gap_seconds": 300},\n "data": [1, 2,,]}\n')
    with pytest.raises(TraceError, match=r"invalid JSON") as err:
        load_trace(path)
    assert f"{path}:2:" in str(err.value)


def test_integral_float_counts_are_accepted(tmp_path):
    trace = load_trace(write(tmp_path, '{"metadata": {"gap_seconds": 60}, "data": [2.0, 3]}'))
    assert trace.counts == ((0.0, 2), (60.0, 3))


# --- scaling --------------------------------------------------------------------------------------

def assert_keeps_every_move(original: SpotTrace, scaled: SpotTrace, cap: int):
    assert all(0 <= c <= cap for _, c in scaled.counts)
    assert scaled.peak == cap and scaled.duration_s == original.duration_s
    for (t0, c0), (t1, c1) in zip(original.counts, original.counts[1:]):
        before, after = scaled.count_at(t0), scaled.count_at(t1)
        blocked = (c1 < c0 and before == 0) or (c1 > c0 and before == cap)
        if not blocked:
            assert sign(after - before) == sign(c1 - c0), (t1, c0, c1, before, after)
    # nothing moves in the scaled trace where the original stands still
    original_times = {t for t, _ in original.counts}
    assert all(t in original_times for t, _ in scaled.counts)


@pytest.mark.parametrize("path", [AWS_EAST, AWS_WEST, G4DN], ids=lambda p: p.name)
@pytest.mark.parametrize("cap", [1, 2, 4])
def test_scale_to_cap_keeps_every_drop_and_rise(path, cap):
    original = load_trace(path)
    assert_keeps_every_move(original, scale_to_cap(original, cap), cap)


def test_scale_to_cap_keeps_most_moves_of_the_aws_trace():
    original = load_trace(AWS_EAST)
    scaled = scale_to_cap(original, 2)
    # rounding alone would lose e.g. 16 -> 14 -> 16; those dips must survive as 2 -> 1 -> 2
    assert len(scaled.counts) > 0.9 * len(original.counts)


def test_scale_to_cap_on_a_small_trace():
    trace = SpotTrace("t", ((0.0, 0), (1.0, 16), (2.0, 15), (3.0, 16), (4.0, 8), (5.0, 0)), 6.0)
    scaled = scale_to_cap(trace, 2)
    assert scaled.counts == ((0.0, 0), (1.0, 2), (2.0, 1), (3.0, 2), (4.0, 1), (5.0, 0))


def test_scale_to_cap_returns_small_traces_unchanged():
    trace = SpotTrace("t", ((0.0, 1), (5.0, 3)), 10.0)
    assert scale_to_cap(trace, 3) is trace
    assert scale_to_cap(trace, 8) is trace


@pytest.mark.parametrize("cap", [0, -1, 1.5, True])
def test_scale_to_cap_rejects_a_bad_cap(cap):
    with pytest.raises(ValueError, match="cap"):
        scale_to_cap(SpotTrace("t", ((0.0, 4),), 1.0), cap)


def test_spot_trace_checks_its_shape():
    with pytest.raises(ValueError):
        SpotTrace("t", ((1.0, 2),), 2.0)
    with pytest.raises(ValueError):
        SpotTrace("t", ((0.0, 2), (1.0, 2)), 2.0)
    with pytest.raises(ValueError):
        SpotTrace("t", ((0.0, 2), (3.0, 1)), 2.0)


# --- synthetic traces -----------------------------------------------------------------------------

def time_weighted_mean(trace: SpotTrace) -> float:
    ends = [t for t, _ in trace.counts[1:]] + [trace.duration_s]
    return sum(c * (end - t) for (t, c), end in zip(trace.counts, ends)) / trace.duration_s


def test_poisson_trace_is_deterministic_from_its_seed():
    a = poisson_trace(2.0, 8, 36_000.0, seed=7, restart_after_s=600.0)
    b = poisson_trace(2.0, 8, 36_000.0, seed=7, restart_after_s=600.0)
    c = poisson_trace(2.0, 8, 36_000.0, seed=8, restart_after_s=600.0)
    assert a == b and a.counts != c.counts
    assert a.counts[0] == (0.0, 8) and a.duration_s == 36_000.0
    assert all(0 <= n <= 8 for _, n in a.counts) and len(a.counts) > 50


def test_poisson_trace_mean_count_matches_the_rates():
    # up for 1/rate on average (30 min), down for 10 min: 3/4 of the nodes are up on average
    trace = poisson_trace(2.0, 20, 200 * 3600.0, seed=0, restart_after_s=600.0)
    assert time_weighted_mean(trace) == pytest.approx(15.0, rel=0.05)


@pytest.mark.parametrize("kwargs, name", [
    (dict(rate_per_hour=0.0), "rate_per_hour"),
    (dict(rate_per_hour=-1.0), "rate_per_hour"),
    (dict(nodes=0), "nodes"),
    (dict(duration_s=0.0), "duration_s"),
    (dict(duration_s=-10.0), "duration_s"),
    (dict(restart_after_s=-1.0), "restart_after_s"),
])
def test_poisson_trace_rejects_bad_arguments(kwargs, name):
    args = dict(rate_per_hour=1.0, nodes=4, duration_s=3600.0, seed=0, restart_after_s=60.0)
    with pytest.raises(ValueError, match=name):
        poisson_trace(**{**args, **kwargs})


# --- replay ---------------------------------------------------------------------------------------

LEADING_ZEROS = SpotTrace("t", ((0.0, 0), (900.0, 3), (2100.0, 7), (3900.0, 2)), 4200.0)


def test_replay_skips_the_leading_empty_stretch_and_scales_time():
    assert initial_count(LEADING_ZEROS) == 3
    assert replay_schedule(LEADING_ZEROS, 0.01) == [
        ReplayEvent(at_s=pytest.approx(12.0), change=4, trace_s=2100.0),
        ReplayEvent(at_s=pytest.approx(30.0), change=-5, trace_s=3900.0),
    ]


def test_replay_from_an_explicit_start():
    assert initial_count(LEADING_ZEROS, start_s=0.0) == 0
    events = replay_schedule(LEADING_ZEROS, 0.5, start_s=0.0)
    assert [(e.at_s, e.change) for e in events] == [(450.0, 3), (1050.0, 4), (1950.0, -5)]
    # a start between changes replays from the count in force then
    assert initial_count(LEADING_ZEROS, start_s=1000.0) == 3
    events = replay_schedule(LEADING_ZEROS, 1.0, start_s=1000.0)
    assert [(e.at_s, e.change) for e in events] == [(1100.0, 4), (2900.0, -5)]
    with pytest.raises(ValueError, match="start_s"):
        replay_schedule(LEADING_ZEROS, 1.0, start_s=-1.0)


def test_replay_of_a_real_trace_adds_up_to_its_counts():
    trace = load_trace(AWS_EAST)
    events = replay_schedule(trace, 0.01)
    assert initial_count(trace) == 3          # the trace starts with 3 empty ticks
    assert events[0] == ReplayEvent(at_s=pytest.approx(12.0), change=4, trace_s=2100.0)
    assert all(e.change != 0 for e in events)
    assert all(a.at_s < b.at_s for a, b in zip(events, events[1:]))
    running = initial_count(trace)
    for e in events:
        running += e.change
        assert running == trace.count_at(e.trace_s)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_replay_rejects_a_bad_time_scale(scale):
    with pytest.raises(ValueError, match="time_scale must be > 0"):
        replay_schedule(LEADING_ZEROS, scale)


def test_replay_of_an_all_empty_trace_is_empty():
    trace = SpotTrace("t", ((0.0, 0),), 100.0)
    assert initial_count(trace) == 0 and replay_schedule(trace, 1.0) == []


# --- victims --------------------------------------------------------------------------------------

WORKERS = [f"tcp://10.0.0.{i}:4000" for i in range(10)]


def test_choose_victims_is_deterministic_and_order_independent():
    shuffled = list(reversed(WORKERS))
    a = choose_victims(WORKERS, 3, np.random.default_rng(5))
    b = choose_victims(shuffled, 3, np.random.default_rng(5))
    assert a == b and len(a) == 3 and len(set(a)) == 3 and set(a) <= set(WORKERS)
    picks = {tuple(choose_victims(WORKERS, 3, np.random.default_rng(s))) for s in range(20)}
    assert len(picks) > 1      # the seed matters


def test_choose_victims_caps_at_the_alive_workers():
    assert sorted(choose_victims(WORKERS[:2], 5, np.random.default_rng(0))) == sorted(WORKERS[:2])
    assert choose_victims(WORKERS, 0, np.random.default_rng(0)) == []
    assert choose_victims([], 3, np.random.default_rng(0)) == []
    with pytest.raises(ValueError, match="n must be >= 0"):
        choose_victims(WORKERS, -1, np.random.default_rng(0))


def test_the_longest_outage_after_the_start_is_measured_in_trace_seconds():
    # The leading empty stretch is before the replay starts (at the first node up).
    trace = SpotTrace("t", ((0.0, 0), (2.0, 3), (4.0, 0), (5.0, 1), (6.0, 0), (9.0, 2),
                            (10.0, 0)), 11.5)
    assert longest_outage_s(trace) == 3.0
    assert longest_outage_s(SpotTrace("t", ((0.0, 2), (1.0, 0)), 10.0)) == 9.0   # never back
    assert longest_outage_s(SpotTrace("t", ((0.0, 2), (1.0, 1)), 10.0)) == 0.0


def test_one_replay_lasts_from_the_start_to_the_end_of_the_trace():
    trace = SpotTrace("t", ((0.0, 0), (2.0, 3), (10.0, 0)), 12.0)
    assert replay_period_s(trace, 0.5) == (12.0 - 2.0) * 0.5   # starts at the first node up
