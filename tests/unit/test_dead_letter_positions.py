"""A checkpoint's dead-letter positions: where a replay's scan for the dead letters it already
wrote starts. They must lie below every dead letter written after the checkpoint (a position too
high and a replay writes some twice: tests/integration/test_aimed_faults.py), and they come
without a broker round trip: from the last checkpoint's, or at a lineage's first checkpoint from
the topic's end as the scan at start read it."""

from streamlearn.train.loop import _dead_letter_positions


def test_a_lineages_first_checkpoint_starts_from_the_end_the_scan_at_start_read():
    end_at_start = {0: 40, 1: 7}
    assert _dead_letter_positions({}, [{0: 12}, {}], end_at_start) == {0: 40, 1: 7}
    assert _dead_letter_positions({}, [{0: 45}, {1: 9}], end_at_start) == {0: 45, 1: 9}
    assert end_at_start == {0: 40, 1: 7}


def test_later_checkpoints_take_the_largest_end_any_rank_delivered_and_never_go_back():
    last = {0: 40, 1: 7}
    end_at_start = {0: 999}  # only a lineage's first checkpoint starts from it
    assert _dead_letter_positions(last, [{0: 45}, {0: 52, 1: 3}, {}], end_at_start) == {0: 52, 1: 7}
    assert _dead_letter_positions(last, [{}, {}], end_at_start) == last  # nothing written: the last still bound
    assert last == {0: 40, 1: 7}
