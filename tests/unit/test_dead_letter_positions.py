"""A checkpoint's dead-letter positions: where a replay's scan for the dead letters it already
wrote starts. They must lie below every dead letter written after the checkpoint (a position too
high and a replay writes some twice: tests/integration/test_aimed_faults.py), and they come
without a broker round trip once a lineage has any."""

from streamlearn.train.loop import _dead_letter_positions


class Stream:
    """What `_dead_letter_positions` asks of the stream: the topic's end, from the broker."""

    def __init__(self, end: dict[int, int]):
        self.end, self.asked = end, 0

    def dlq_positions(self) -> dict[int, int]:
        self.asked += 1
        return dict(self.end)


def test_a_lineages_first_checkpoint_asks_the_broker_for_the_topics_end():
    stream = Stream({0: 40, 1: 7})
    assert _dead_letter_positions({}, [{0: 12}, {}], stream) == {0: 40, 1: 7}
    assert stream.asked == 1


def test_later_checkpoints_take_the_largest_end_any_rank_delivered_and_never_go_back():
    stream = Stream({0: 999})
    last = {0: 40, 1: 7}
    assert _dead_letter_positions(last, [{0: 45}, {0: 52, 1: 3}, {}], stream) == {0: 52, 1: 7}
    assert _dead_letter_positions(last, [{}, {}], stream) == last  # nothing written: the last still bound
    assert last == {0: 40, 1: 7} and stream.asked == 0
