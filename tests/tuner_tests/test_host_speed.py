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


# Slow phases of seconds (docs/BENCHMARKS.md, 2026-11-27): a host whose speed is scripted by the time
# on its own clock, a test double for the lent machines' host phases, which this CPU does not have. Spins cost
# the clock what they read; sleeps and the timed calls advance it too.

class _PhasedHost(timing.HostSpeed):
    """Spins read 160 us while ``slow(now)`` holds (seconds on this host's clock), else 100 us; ``blip``
    makes the spins at those indices read the other speed (an interrupt in a fast phase, a fast spin in a
    slow one)."""

    def __init__(self, slow, blips: tuple[int, ...] = ()) -> None:
        self.now = 0.0
        super().__init__(clock=lambda: self.now, sleep=self._sleep)
        self.slow, self.blips, self.spins = slow, blips, 0

    def _sleep(self, seconds: float) -> None:
        self.now += seconds

    def slowed(self) -> bool:
        return self.slow(self.now)

    def spin_us(self) -> float:
        slow = self.slowed() != (self.spins in self.blips)
        self.spins += 1
        spent = 160.0 if slow else 100.0
        self.now += spent * 1e-6
        self.fastest_us = min(self.fastest_us, spent)
        return spent


def test_learning_starts_in_a_slow_phase_and_finds_the_fast_speed_when_it_comes() -> None:
    host = _PhasedHost(lambda now: now < 3.0)
    assert host.learn() == 100.0
    assert 3.0 <= host.now < 3.0 + 3 * timing.HOST_LEARN_WINDOW_S, "learned once the fast phase had been seen"
    before = host.now
    assert host.learn() == 100.0 and host.now == before, "once per process"


def test_learning_from_a_fast_phase_ends_once_a_slow_one_shows_both_speeds() -> None:
    host = _PhasedHost(lambda now: 1.0 <= now < 5.0)
    assert host.learn() == 100.0
    assert 1.0 <= host.now < 1.0 + 3 * timing.HOST_LEARN_WINDOW_S


def test_one_slow_spin_is_not_a_slow_phase_and_a_steady_host_learns_for_the_whole_budget() -> None:
    host = _PhasedHost(lambda now: False, blips=(5, 6))
    assert host.learn(budget_s=2.0) == 100.0
    assert host.now >= 2.0, "two interrupted spins in one window left its median at the fast speed"
    steady_slow = _PhasedHost(lambda now: True)
    assert steady_slow.learn(budget_s=1.0) == 160.0, "a host with one speed: that speed is its nominal one"


def test_settling_waits_for_the_nominal_speed_and_a_lone_fast_spin_does_not_end_the_wait() -> None:
    host = _PhasedHost(lambda now: 1.0 <= now < 6.0, blips=())
    host.learn()
    host.now = 2.0  # into the slow phase
    host.blips = (host.spins + 3,)  # one fast spin inside it
    waited = host.settle(budget_s=10.0)
    assert 4.0 <= waited < 4.1 and host.now >= 6.0
    host.now = 2.0
    assert host.settle(budget_s=1.5) >= 1.5, "gives up after its budget"
    assert host.settle(budget_s=10.0) < 5.0  # still slow at 3.5 s: waits for 6 s, no further


def _phased_reading(monkeypatch, host: _PhasedHost, settle_s: float) -> timing.EagerReading:
    import torch

    class FakeEvent:  # CUDA events read the host's clock (host-bound calls: the host's pace is the time)
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = 0.0

        def record(self) -> None:
            self.t = host.now * 1e3

        def elapsed_time(self, end: "FakeEvent") -> float:
            return end.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(timing, "_warmed_estimate_ms", lambda call, inputs: 0.010)

    def call(x) -> None:
        host.now += 20e-6 if host.slowed() else 10e-6  # a slowed host issues each call at half the pace

    return timing.eager_side_by_side([call], [(None,)], total_ms=20.0, block_ms=1.0, host=host, settle_s=settle_s)


def test_a_reading_in_a_slow_phase_of_seconds_waits_for_the_nominal_speed(monkeypatch) -> None:
    # The fast speed was seen at the start; the reading begins 1 s into a 5 s slow phase.
    unsettled = _PhasedHost(lambda now: 1.0 <= now < 6.0)
    unsettled.learn()
    unsettled.now = 2.0
    reading = _phased_reading(monkeypatch, unsettled, settle_s=0.0)
    assert reading.nominal_turns == 0 and abs(reading.nominal_ms[0] - 0.020) < 1e-6, "the phase's pace, as run"
    settled = _PhasedHost(lambda now: 1.0 <= now < 6.0)
    settled.learn()
    settled.now = 2.0
    reading = _phased_reading(monkeypatch, settled, settle_s=timing.HOST_SETTLE_S)
    assert 3.9 <= reading.waited_s < 4.1
    assert reading.nominal_turns >= 20 and abs(reading.nominal_ms[0] - 0.010) < 1e-6, "read at the nominal pace"


def test_a_reading_that_waited_in_vain_says_so_and_counts_every_turn(monkeypatch) -> None:
    host = _PhasedHost(lambda now: 1.0 <= now)  # slow from 1 s on, for good
    host.learn()
    host.now = 2.0
    reading = _phased_reading(monkeypatch, host, settle_s=0.5)
    assert reading.nominal_turns == 0 and abs(reading.nominal_ms[0] - 0.020) < 1e-6
    assert reading.waited_s >= timing.HOST_SETTLE_TRIES * 0.5


def test_the_learned_speed_is_said_in_one_line_for_the_log() -> None:
    host = _PhasedHost(lambda now: now < 2.0)
    line = timing.learn_host(host)
    assert line.startswith("host: nominal spin 100 us (2000 loops of Python), learned in "), line
    assert host.learned
