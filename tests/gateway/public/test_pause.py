"""The pause after a failed store call: when it starts, how long it lasts, and what restarts it."""

from __future__ import annotations

from gateway.public.pause import Pause


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_pause_before_a_failure() -> None:
    assert not Pause(2.0, Clock()).active()


def test_a_failure_pauses_until_duration_after_it_and_not_at_the_deadline() -> None:
    clock = Clock()
    pause = Pause(2.0, clock)
    pause.start()
    clock.now = 101.999
    assert pause.active()
    clock.now = 102.0  # the deadline itself: the store is tried again
    assert not pause.active()


def test_a_failure_during_a_pause_restarts_it_from_that_failure() -> None:
    clock = Clock()
    pause = Pause(2.0, clock)
    pause.start()
    clock.now = 101.5
    pause.start()
    clock.now = 103.0
    assert pause.active()
    clock.now = 103.5
    assert not pause.active()


def test_start_says_whether_it_began_an_outage() -> None:
    clock = Clock()
    pause = Pause(2.0, clock)
    assert pause.start()
    clock.now = 101.0
    assert not pause.start()  # already paused: the same outage
    clock.now = 103.0
    assert pause.start()  # the pause had ended: a new outage


def test_a_zero_pause_never_skips_the_store() -> None:
    pause = Pause(0.0, Clock())
    pause.start()
    assert not pause.active()
