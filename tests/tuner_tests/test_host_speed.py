"""The host-speed gate of eager timing (tuner.timing.nominal_turns, HostSpeed): which turns of a side-by-side
eager reading count. Pure logic and a real spin of this host; the GPU side is in test_timing.py."""

from __future__ import annotations

import math

from tuner import timing


def test_a_turn_counts_only_where_the_spins_on_both_sides_of_it_are_nominal() -> None:
    spins = [100.0, 104.0, 150.0, 101.0, 119.0, 100.0]
    assert timing.nominal_turns(spins, fastest_us=100.0, slack=1.2) == [True, False, False, True, True]


def test_the_fastest_spin_the_process_has_seen_sets_the_bar_when_a_whole_reading_is_slow() -> None:
    slow_reading = [150.0, 151.0, 149.0]
    assert timing.nominal_turns(slow_reading, fastest_us=100.0) == [False, False]
    # Without a faster spin seen before, the reading's own fastest sets it.
    assert timing.nominal_turns(slow_reading, fastest_us=math.inf) == [True, True]


def test_no_spins_no_turns() -> None:
    assert timing.nominal_turns([], fastest_us=100.0) == []
    assert timing.nominal_turns([100.0], fastest_us=100.0) == []


def test_the_host_spin_is_timed_and_the_least_is_kept() -> None:
    host = timing.HostSpeed(loops=5000)
    readings = [host.spin_us() for _ in range(5)]
    assert all(r > 0 for r in readings)
    assert host.fastest_us == min(readings)
    # Five times the loop takes longer than the loop (the spin is real work, not a constant).
    longer = timing.HostSpeed(loops=25000)
    assert min(longer.spin_us() for _ in range(5)) > host.fastest_us
