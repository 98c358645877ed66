"""The faults benchmark's scoring figures: what failed once a model was served, and for how long
requests kept failing (issue 47: no longer than a leader election)."""

from load.bench.faults import scoring_figures


def test_failures_before_the_first_model_do_not_count_and_the_longest_failing_span_is_measured():
    requests = [(0.0, 0.01, 503), (1.0, 0.01, 503),  # no model yet
                (2.0, 0.01, 200), (3.0, 0.5, 0), (3.6, 0.2, 500), (4.5, 0.01, 200),  # failing from 3.0 to 4.5
                (5.0, 0.01, 200), (6.0, 0.3, 0)]  # still failing at the end: until its answer's time, 6.3
    figures = scoring_figures(list(reversed(requests)))  # clients append out of order
    assert figures["requests_once_served"] == 6
    assert figures["failed_once_served"] == 3
    assert figures["longest_failing_span_s"] == 1.5
    assert figures["slowest_answered_s"] == 0.01


def test_no_request_answered_gives_no_latency_and_no_span():
    figures = scoring_figures([(0.0, 0.01, 503), (1.0, 0.01, 503)])
    assert figures["requests_once_served"] == 0 and figures["longest_failing_span_s"] == 0.0
    assert figures["p99_ms"] is None and figures["slowest_answered_s"] is None
