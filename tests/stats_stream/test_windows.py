from stats_stream.windows import WindowClock, from_ms, is_late, to_ms, window_start


def test_an_event_falls_in_the_window_that_starts_at_or_before_it() -> None:
    assert window_start(125_000, 60_000) == 120_000
    assert window_start(120_000, 60_000) == 120_000
    assert window_start(119_999, 60_000) == 60_000


def test_milliseconds_round_trip_through_datetimes() -> None:
    assert to_ms(from_ms(1_767_268_800_123)) == 1_767_268_800_123


def test_a_window_closes_only_after_event_time_passes_its_end_plus_grace() -> None:
    clock = WindowClock(size_ms=1000, grace_ms=200, idle_close_ms=10_000)
    clock.arm(0)
    clock.observe(1100, wall_ms=1100)
    assert clock.due([0, 1000], wall_ms=1100) == []
    clock.observe(1200, wall_ms=1200)
    assert clock.due([0, 1000], wall_ms=1200) == [0]


def test_a_quiet_stream_closes_its_windows_by_the_wall_clock() -> None:
    clock = WindowClock(size_ms=1000, grace_ms=200, idle_close_ms=3000)
    clock.arm(0)
    clock.observe(500, wall_ms=500)
    assert clock.due([0], wall_ms=3000) == []
    assert clock.due([0], wall_ms=3500) == [0]


def test_a_backlog_does_not_close_windows_by_the_wall_clock() -> None:
    clock = WindowClock(size_ms=1000, grace_ms=200, idle_close_ms=3000)
    wall = 100_000
    for event_ms in range(0, 900, 100):  # old events arriving now, back to back
        clock.observe(event_ms, wall_ms=wall)
    assert clock.due([0], wall_ms=wall + 10) == []


def test_the_idle_timer_starts_when_the_stream_is_armed_not_before() -> None:
    clock = WindowClock(size_ms=1000, grace_ms=0, idle_close_ms=3000)
    assert clock.due([0], wall_ms=10_000) == []
    clock.arm(10_000)
    assert clock.due([0], wall_ms=12_000) == []
    assert clock.due([0], wall_ms=13_000) == [0]


def test_a_window_never_closes_by_the_wall_clock_while_input_is_unread() -> None:
    clock = WindowClock(size_ms=1000, grace_ms=0, idle_close_ms=3000)
    clock.observe(500, wall_ms=500)  # counted before a restart; the backlog behind it is not read yet
    assert clock.due([0], wall_ms=60_000) == []
    clock.arm(60_000)  # the backlog is read: quiet from here on is a quiet fleet
    assert clock.due([0], wall_ms=62_999) == []
    assert clock.due([0], wall_ms=63_000) == [0]


def test_a_window_never_closes_by_event_time_while_input_is_unread() -> None:
    clock = WindowClock(size_ms=1000, grace_ms=200, idle_close_ms=60_000)
    clock.observe(500, wall_ms=9000)  # a backlog: this window's events on one partition...
    clock.observe(5000, wall_ms=9000)  # ...a later window's on another, read first
    assert clock.due([0, 5000], wall_ms=9000) == []  # the rest of window 0 may still be unread
    clock.arm(9000)  # every partition is read to the end it had at the start
    assert clock.due([0, 5000], wall_ms=9000) == [0]


def test_disarming_stops_the_idle_close_and_arming_again_restarts_its_timer() -> None:
    clock = WindowClock(size_ms=1000, grace_ms=0, idle_close_ms=3000)
    clock.arm(1000)
    clock.disarm()  # partitions moved: a new backlog is unread
    assert clock.due([0], wall_ms=10_000) == []
    clock.arm(10_000)
    clock.arm(12_000)  # arming an armed clock does not restart its timer
    assert clock.due([0], wall_ms=12_999) == []
    assert clock.due([0], wall_ms=13_000) == [0]


def test_a_producer_with_a_fast_clock_cannot_close_windows_early() -> None:
    clock = WindowClock(size_ms=1000, grace_ms=0, idle_close_ms=60_000)
    clock.arm(500)
    clock.observe(999_999, wall_ms=500)
    assert clock.due([0, 1000], wall_ms=500) == []


def test_due_windows_come_oldest_first() -> None:
    clock = WindowClock(size_ms=1000, grace_ms=0, idle_close_ms=60_000)
    clock.arm(5000)
    clock.observe(5000, wall_ms=5000)
    assert clock.due([3000, 1000, 2000, 4000, 5000], wall_ms=5000) == [1000, 2000, 3000, 4000]


def test_events_at_or_before_the_last_closed_window_are_late() -> None:
    assert is_late(1000, closed_through_ms=1000)
    assert is_late(0, closed_through_ms=1000)
    assert not is_late(2000, closed_through_ms=1000)
    assert not is_late(0, closed_through_ms=None)
