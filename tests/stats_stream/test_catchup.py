from stats_stream.catchup import CatchUp

A, B = ("requests.completed", 0), ("replica.state", 3)


def test_nothing_is_vouched_for_before_an_assignment_is_measured() -> None:
    catchup = CatchUp()
    catchup.read(A, 10)
    assert not catchup.caught_up()
    assert catchup.token() is None
    assert not catchup.vouches(None)


def test_the_backlog_is_read_once_every_partition_reaches_its_end_at_assignment() -> None:
    catchup = CatchUp()
    catchup.start(ends={A: 5, B: 2}, starts={A: 3, B: 2})  # B had nothing waiting
    assert catchup.token() is None
    catchup.read(A, 3)
    assert not catchup.caught_up()
    catchup.read(A, 4)
    token = catchup.token()
    assert token is not None and catchup.vouches(token)
    catchup.read(A, 5)  # events after the measured end do not hold the rule back
    assert catchup.vouches(token)


def test_a_partition_never_committed_is_read_from_its_log_start() -> None:
    catchup = CatchUp()
    catchup.start(ends={A: 0, B: 0}, starts={A: 0, B: 0})
    assert catchup.caught_up()


def test_progress_read_before_the_measurement_still_counts() -> None:
    catchup = CatchUp()
    catchup.read(A, 8)
    catchup.start(ends={A: 9}, starts={A: 4})
    assert catchup.caught_up()


def test_a_token_from_another_process_or_an_earlier_assignment_vouches_for_nothing() -> None:
    other = CatchUp()
    other.start(ends={}, starts={})
    catchup = CatchUp()
    catchup.start(ends={A: 1}, starts={A: 1})
    earlier = catchup.token()
    assert earlier is not None and not catchup.vouches(other.token())
    catchup.stop()
    assert catchup.token() is None and not catchup.vouches(earlier)
    catchup.start(ends={A: 1}, starts={A: 1})
    assert not catchup.vouches(earlier)
    assert catchup.vouches(catchup.token())
