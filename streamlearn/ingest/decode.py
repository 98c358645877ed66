"""A slice of a window, decoded: events parsed, validated and featurized, the bad ones with the
reason they will be dead-lettered, and the `Batch` a rank learns. One decoder for both ingest
modes (each rank's WorkerStream, and Ray Data's lanes) and one set of dead-letter reasons."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from streamlearn.ingest.reader import Message
from streamlearn.ingest.windows import Window
from streamlearn.pipeline import Pipeline

FINGERPRINT_MOD = 1 << 56  # ranks' partial sums must add up inside an int64


@dataclass
class Batch:
    """The learnable part of one rank's slice of one window."""

    window: Window
    features: np.ndarray
    targets: np.ndarray
    crcs: np.ndarray  # crc32 of each row's bytes, added to the fingerprint once its step is taken
    bad: list[tuple[Message, str]]  # dead-lettered once this window is learned, not when read
    read_s: float = 0.0
    # With joined labels (labelled.py): the rows are the events whose labels came in this
    # window, whenever the events did, and the events learned with the pipeline's `unlabelled_as`
    # (`defaulted` of them); labels to dead-letter; events that left unlabelled and unlearned;
    # at a checkpoint window, what the checkpoint writes of the join state right after this
    # window (`LabelJoin.delta`: the read of the next one may already be under way when the
    # checkpoint is taken). With delayed feedback (feedback.py): the window's events with the
    # silent answer (`defaulted`) and the events its reports named, with the reports' answer;
    # `ignored`: reports that gave the silent answer, which change nothing.
    bad_labels: list[tuple[Message, str]] = field(default_factory=list)
    expired: int = 0
    defaulted: int = 0
    ignored: int = 0
    join_delta: dict[str, np.ndarray] | None = None
    # Delayed feedback: features of events whose attribution window ended unreported, read back
    # for the quality signals (ingest/maturing.py), never learned; and how long ago they arrived.
    matured: np.ndarray | None = None
    matured_age_s: float | None = None

    @property
    def size(self) -> int:
        return len(self.targets)

    @property
    def dead_lettered(self) -> int:
        return len(self.bad) + len(self.bad_labels)



@dataclass
class Decoded:
    """A slice's events, decoded: features and targets of the valid ones, their fingerprints,
    the bad ones' dead letters; and what the join needs (the messages, their bytes, the valid
    events and their rows)."""

    messages: list
    values: list[bytes]
    events: list[dict]
    kept: list[int]
    x: np.ndarray
    y: np.ndarray
    crcs: np.ndarray
    dead: list[tuple[Message, str]]

    def batch(self, window: Window | None, read_s: float = 0.0) -> Batch:
        """What is learned of the slice when no labels are joined: its events with their own targets."""
        return Batch(window, self.x, self.y, self.crcs, self.dead, read_s)


def decode_events(pipeline: Pipeline, messages: list) -> Decoded:
    """Parse, validate, featurize and fingerprint a slice's messages (the direct path's ranks and
    the Ray Data lanes: one decoder, one set of dead-letter reasons)."""
    values = [m.value() for m in messages]
    events, decoded, bad = pipeline.schema.decode_many(values)
    x, y, kept, bad = featurize(pipeline, events, decoded, bad)
    crc32 = zlib.crc32
    crcs = np.fromiter((crc32(values[i]) for i in kept), dtype=np.uint32, count=len(kept))
    dead = [(Message(messages[i].partition(), messages[i].offset(), values[i]), reason) for i, reason in sorted(bad)]
    if len(kept) < len(decoded):  # the pipeline refused some: keep the events that have rows
        rows = set(kept)
        events = [e for e, i in zip(events, decoded, strict=True) if i in rows]
    return Decoded(messages, values, events, kept, x, y, crcs, dead)



def feature_width(pipeline: Pipeline) -> int:
    """Columns of the pipeline's feature matrix (the join state's row width)."""
    x0, _, _, _ = featurize(pipeline, [], [], [])
    return int(np.asarray(x0).shape[1])


def _no_targets(events: list[dict]) -> np.ndarray:
    return np.zeros(len(events), np.float32)


def featurize(pipeline: Pipeline, events: list[dict], kept: list[int], bad: list[tuple[int, str]]):
    """Features and targets of decoded events. A pipeline that chokes on a valid event
    dead-letters that event, not the whole rank. With joined labels the targets come with the
    labels (labelled.py): zeros here."""
    features, targets = pipeline.features, pipeline.targets if pipeline.labels is None else _no_targets
    try:
        return features(events), targets(events), kept, bad
    except Exception:
        pass  # find the culprits one by one: rare, so the slow path is fine
    good_events, good_kept, bad = [], [], list(bad)
    for event, index in zip(events, kept, strict=True):
        try:
            features([event]), targets([event])
        except Exception as e:
            bad.append((index, f"featurize_error: {type(e).__name__}: {str(e)[:200]}"))
            continue
        good_events.append(event)
        good_kept.append(index)
    return features(good_events), targets(good_events), good_kept, bad
