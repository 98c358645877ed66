import gc

import pytest

from streamlearn import heap


@pytest.fixture
def collector():
    """Whatever a test does to the collector is undone for the tests after it."""
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()


def test_streaming_freezes_the_heap_and_collects_the_young_generation_less_often(collector):
    older = gc.get_threshold()[1:]
    heap.quiet_for_streaming()
    assert gc.get_freeze_count() > 0  # start-up's objects are out of every collection
    assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, *older)  # only the young generation's changes


def test_a_shared_process_gets_its_collector_back(collector):
    before = gc.get_threshold()
    with heap.quiet_while_streaming():
        assert gc.get_threshold()[0] == heap.YOUNG_THRESHOLD
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_lane_that_fails_gives_the_collector_back_too(collector):
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), heap.quiet_while_streaming():
        raise RuntimeError("broker gone")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
