"""`make test` runs both suites at once, on pytest-xdist's two workers (`-n 2`): all of
tests/integration is one unit of work, so one worker runs it in order, on one Kafka broker and
one Ray cluster, while the other runs the unit tests in the integration session's idle time (its
cores idle ~30 % of the time, waiting on process starts, brokers and Ray). Our own scheduler, not
`--dist loadgroup`: xdist 3.8 marks a group by rewriting `item._nodeid`, which pytest 9 no
longer reads, so every group mark is silently dropped there."""

from __future__ import annotations

INTEGRATION = "tests/integration/"


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class IntegrationTogether(LoadScopeScheduling):
        """Scopes: the whole integration suite, and each other test alone. xdist hands out the
        largest scope first (`--loadscope-reorder`, its default), so the integration suite starts
        at once."""

        def _split_scope(self, nodeid: str) -> str:
            return INTEGRATION if nodeid.startswith(INTEGRATION) else nodeid

    return IntegrationTogether(config, log)
