"""One exception root for everything streamlearn raises on purpose.

Callers catch `StreamlearnError` to tell our failures (with a message that says how
to fix them) from bugs. Subclasses stay one line each.
"""


class StreamlearnError(Exception):
    """Root of every error streamlearn raises deliberately."""


class ConfigError(StreamlearnError, ValueError):
    """A setting is missing or wrong; the message says which and how to fix it."""


class KafkaUnavailable(StreamlearnError):
    """No broker answered at the bootstrap address."""


class BrokerStartError(StreamlearnError):
    """The embedded broker did not come up; the message points at its log."""


class BadEvent(StreamlearnError):
    """An event failed to decode or validate; `reason` is what goes to the dead-letter topic."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class CheckpointError(StreamlearnError):
    """A checkpoint is missing, unreadable or fails its integrity check."""


class PipelineError(StreamlearnError):
    """A pipeline could not be found or breaks the pipeline contract."""


class IngestError(StreamlearnError):
    """The Ray Data stream broke the window contract (ended early, or more rows than offsets)."""


class WorkerStartError(StreamlearnError):
    """Ray Train's workers died as they started, group after group; the message names the cause."""


class ServeError(StreamlearnError):
    """The scorer was deployed but does not answer at its URL."""
