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


# The reading's loop on the CPU. CUDA events cannot run here, so a test double stands in for them: events read a
# fake clock that each call advances by its cost (host-bound calls: the host's pace sets the time). The host's
# speed is scripted by a HostSpeed whose spins report fast or slow, and whose slow phases make each call cost more.

class _Clock:
    def __init__(self) -> None:
        self.now = 0.0


def _fake_events(monkeypatch, clock: _Clock) -> None:
    import torch

    class FakeEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = 0.0

        def record(self) -> None:
            self.t = clock.now

        def elapsed_time(self, end: "FakeEvent") -> float:
            return end.t - self.t

        def synchronize(self) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(timing, "_warmed_estimate_ms", lambda call, inputs: 0.010)


class _ScriptedHost(timing.HostSpeed):
    """Spins read ``slow_us`` where ``slow(index)`` says, else 100 us; ``slowed`` holds until the next spin."""

    def __init__(self, slow, slow_us: float = 150.0, fastest_us: float = float("inf")) -> None:
        super().__init__()
        self.slow, self.slow_us, self.spins, self.slowed = slow, slow_us, 0, False
        self.fastest_us = fastest_us

    def spin_us(self) -> float:
        self.slowed = self.slow(self.spins)
        self.spins += 1
        spent = self.slow_us if self.slowed else 100.0
        self.fastest_us = min(self.fastest_us, spent)
        return spent


def _reading(monkeypatch, host: _ScriptedHost) -> timing.EagerReading:
    clock = _Clock()
    _fake_events(monkeypatch, clock)

    def call(x) -> None:
        clock.now += 0.020 if host.slowed else 0.010  # ms: a slowed host issues each call at half the pace

    return timing.eager_side_by_side([call], [(None,)], total_ms=20.0, block_ms=1.0, host=host)


def test_a_steady_host_reads_the_turns_asked_and_every_one_counts(monkeypatch) -> None:
    reading = _reading(monkeypatch, _ScriptedHost(lambda index: False))
    assert reading.turns == 20 and reading.nominal_turns == 20
    assert reading.nominal_ms == reading.all_ms and abs(reading.all_ms[0] - 0.010) < 1e-9


def test_bursts_are_set_aside_and_the_turns_go_on_for_nominal_ones(monkeypatch) -> None:
    # Three spins of every five slow: a turn is nominal only between two fast spins, one turn in five.
    reading = _reading(monkeypatch, _ScriptedHost(lambda index: index % 5 >= 2))
    assert reading.turns == timing.HOST_EXTRA_TURNS * 20, "20 nominal turns were asked: the turns ran to the limit"
    assert reading.nominal_turns == 12
    assert abs(reading.nominal_ms[0] - 0.010) < 1e-9, "read at the host's nominal pace"
    assert abs(reading.all_ms[0] - 0.020) < 1e-9, "over every turn, the bursts' pace (most turns)"


def test_a_host_never_at_its_nominal_speed_counts_every_turn(monkeypatch) -> None:
    # The process once spun at 50 us: every spin of this reading is slow, so no turn is nominal.
    reading = _reading(monkeypatch, _ScriptedHost(lambda index: True, fastest_us=50.0))
    assert reading.nominal_turns == 0 and reading.turns == timing.HOST_EXTRA_TURNS * 20
    assert reading.nominal_ms == reading.all_ms and abs(reading.all_ms[0] - 0.020) < 1e-9
