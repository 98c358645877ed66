"""The resize state machine: warm handovers, the cold fallback, and every way a resize is called off."""

from streamlearn.autoscale.handover import Resizer


def test_warm_resize_starts_the_new_group_beside_the_old_and_hands_over_at_its_checkpoint():
    r = Resizer(group=1, warm_wait_s=60)
    assert r.bundles_to_ask(2, now=0) == 2  # room for a whole group of 2 beside the running one
    assert r.consider(2, "lag", 0, room_beside=False, room_after=True) is None  # wait for that room
    began = r.consider(2, "lag", 5, room_beside=True, room_after=True)
    assert began.warm and began.state == "warming"
    assert r.stop_due() is None  # the old group learns on while the new one comes up
    assert r.warm_plan(gen=1) == 2 and r.warm_plan(gen=2) is None  # started once
    assert r.bundles_to_ask(2, now=6) == 2
    assert r.handover(1) == "wait" and r.stop_due() is None
    assert r.warm_ready(1)
    assert r.bundles_to_ask(2, now=7) == 0  # its placement group holds the room now
    assert r.stop_due() == 2 and r.stop_due() == 2  # asked again until it stops
    assert r.handover(1) == "wait"
    assert r.stopped(last_step_t=100.0)
    assert r.group == 2 and r.handover(1) == "go"
    assert r.take() == ("warm", 2)
    record = r.first_step(101.5)
    assert record["mode"] == "warm" and record["from"] == 1 and record["to"] == 2 and record["pause_s"] == 1.5
    assert r.current is None and r.first_step(102) is None


def test_a_resize_record_says_where_its_seconds_went_from_the_decision_on():
    r = Resizer(group=1, warm_wait_s=60)
    r.consider(2, "lag", 10.0, room_beside=False, room_after=False)  # the decision; no room yet
    r.consider(2, "lag", 22.0, room_beside=True, room_after=True)  # the autoscaler added it
    assert r.warm_plan(gen=1, now=22.5) == 2
    assert r.warm_ready(1, now=52.5)
    assert r.stop_due() == 2
    assert r.stopped(last_step_t=58.0)
    record = r.first_step(60.5)
    assert record["requested_at"] == 22.0 and record["decided_at"] == 10.0
    assert record["decision_to_first_step_s"] == 50.5
    assert record["seconds"] == {"waiting_for_room": 12.0, "until_started": 0.5, "group_start": 30.0,
                                 "old_group_to_stop": 5.5, "pause": 2.5}
    assert sum(record["seconds"].values()) == record["decision_to_first_step_s"]


def test_no_room_beside_within_warm_wait_falls_back_to_stopping_first():
    r = Resizer(group=2, warm_wait_s=30)
    assert r.consider(1, "calm", 0, room_beside=False, room_after=True) is None
    assert r.consider(1, "calm", 29, room_beside=False, room_after=True) is None
    assert r.bundles_to_ask(1, now=29) == 1  # still asking for room for a group of 1 beside
    began = r.consider(1, "calm", 30, room_beside=False, room_after=True)
    assert not began.warm and began.state == "stopping"
    assert r.bundles_to_ask(1, now=30) == 0  # a smaller group needs nothing more
    assert r.warm_plan(gen=1) is None
    assert r.stop_due() == 1
    assert r.stopped(last_step_t=50.0) and r.group == 1
    assert r.take(52.0) == ("cold", 1)
    record = r.first_step(120.0)
    assert record["pause_s"] == 70.0
    # Counted from the decision (t=0), not from when the resize began (t=30): a cold resize's
    # new group starts inside the pause.
    assert record["decision_to_first_step_s"] == 120.0
    assert record["seconds"] == {"waiting_for_room": 30.0, "old_group_to_stop": 20.0, "group_start": 68.0,
                                 "pause": 70.0}


def test_cold_scale_up_asks_for_the_difference_and_waits_for_it():
    r = Resizer(group=1, warm_wait_s=0)  # 0: never two groups at once
    assert r.bundles_to_ask(3, now=0) == 2
    assert r.consider(3, "lag", 0, room_beside=True, room_after=False) is None
    assert r.consider(3, "lag", 1, room_beside=True, room_after=True).state == "stopping"
    assert r.bundles_to_ask(3, now=1) == 2  # until the new group learns
    r.stop_due()
    r.stopped(2.0)
    assert r.take() == ("cold", 3)
    assert r.bundles_to_ask(3, now=3) == 0  # restarting: the new group's own request covers it


def test_a_waiting_group_goes_home_when_the_old_one_ends_for_another_reason():
    r = Resizer(group=1, warm_wait_s=60)
    r.consider(2, "lag", 0, room_beside=True, room_after=True)
    assert r.warm_plan(gen=4) == 2
    assert r.take() == ("end", None)  # the old group hit --max-events or --until-idle
    assert r.handover(4) == "abort" and not r.warm_ready(4)
    assert r.current is None


def test_a_warm_group_that_fails_before_the_stop_is_dropped_and_the_resize_can_begin_again():
    r = Resizer(group=1, warm_wait_s=60)
    r.consider(2, "lag", 0, room_beside=True, room_after=True)
    r.warm_plan(gen=1)
    r.warm_failed(1)
    assert r.current is None and r.handover(1) == "abort" and r.stop_due() is None
    assert r.consider(2, "lag", 10, room_beside=True, room_after=True).state == "warming"
    assert r.warm_plan(gen=2) == 2


def test_a_warm_group_that_fails_after_the_stop_finishes_the_resize_cold():
    r = Resizer(group=1, warm_wait_s=60)
    r.consider(2, "lag", 0, room_beside=True, room_after=True)
    r.warm_plan(gen=1)
    r.warm_ready(1)
    assert r.stop_due() == 2
    r.warm_failed(1)
    assert r.stopped(9.0)
    assert r.take() == ("cold", 2)
    assert r.first_step(30.0)["mode"] == "cold"


def test_a_resize_not_started_yet_follows_the_target_or_is_dropped():
    r = Resizer(group=1, warm_wait_s=60)
    r.consider(3, "lag", 0, room_beside=True, room_after=True)
    r.consider(2, "lag eases", 1, room_beside=True, room_after=True)
    assert r.current.to == 2
    r.consider(1, "calm", 2, room_beside=True, room_after=True)
    assert r.current is None and r.warm_plan(gen=1) is None


def test_reports_outside_a_resize_change_nothing():
    r = Resizer(group=2, warm_wait_s=60)
    assert not r.stopped(1.0) and r.first_step(2.0) is None and r.take() == ("end", None)
    assert r.handover(7) == "wait" and not r.warm_ready(7)
    assert r.bundles_to_ask(2, now=0) == 0 and r.group == 2


def test_driver_calls_asked_twice_give_the_same_answer():
    """The driver retries a call whose reply was lost (controller.call); a second ask must not
    lose the warm group it started nor the cold restart it was told to make."""
    r = Resizer(group=1, warm_wait_s=60)
    r.consider(2, "lag", 0, room_beside=True, room_after=True)
    assert r.warm_plan(gen=3) == 2 and r.warm_plan(gen=3) == 2 and r.warm_plan(gen=4) is None
    cold = Resizer(group=2, warm_wait_s=0)
    cold.consider(1, "calm", 0, room_beside=True, room_after=True)
    cold.stop_due()
    cold.stopped(1.0)
    assert cold.take() == ("cold", 1) and cold.take() == ("cold", 1)
