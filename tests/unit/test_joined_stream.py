"""The join of a window (`decode.decode_events` + `LabelJoin.batch`, what a direct-path rank
and a Ray Data lane both run) on confluent-shaped messages: what
comes out is each labelled event with its own label as the target and its own bytes in the
fingerprint; malformed labels and duplicates go to the dead letters with their reasons; a
checkpoint window carries the state. Kafka itself: tests/integration/test_delayed_labels.py."""

from __future__ import annotations

import json
import zlib
from types import SimpleNamespace

from streamlearn.ingest.decode import decode_events, feature_width
from streamlearn.ingest.labelled import LabelJoin
from streamlearn.ingest.windows import Window
from streamlearn.loadgen.generator import BankingSimulator, encode_batch
from streamlearn.loadgen.labels import encode_label
from streamlearn.pipeline import load_pipeline


class Msg:
    """What confluent-kafka's consume() returns, as far as the stream reads it."""

    def __init__(self, partition: int, offset: int, value: bytes, t_ms: int):
        self._p, self._o, self._v, self._t = partition, offset, value, t_ms

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def value(self):
        return self._v

    def timestamp(self):
        return 1, self._t


def _stream() -> SimpleNamespace:
    pipeline = load_pipeline("fraud_delayed")  # the joining half only: no Kafka
    return SimpleNamespace(pipeline=pipeline, join=LabelJoin(pipeline.labels, feature_width(pipeline), 2))


def _window(stream: SimpleNamespace, messages: list[Msg], labels: list[Msg], checkpoint: bool = False):
    return stream.join.batch(stream.pipeline, Window(0, {}, checkpoint=checkpoint),
                             decode_events(stream.pipeline, messages), labels)


def test_a_window_learns_each_labelled_event_with_its_own_label():
    stream = _stream()
    events = BankingSimulator(4).events(300)
    raw = encode_batch(events, with_label=False)
    messages = [Msg(i % 2, i // 2, v, e["event_time"]) for i, (e, v) in enumerate(zip(events, raw, strict=True))]
    # Labels for every other event, 1 s after it; one malformed label.
    labels = [Msg(i % 2, n, encode_label(e["event_id"], e["is_fraud"], e["event_time"] + 1000), e["event_time"] + 1000)
              for n, (i, e) in enumerate((i, e) for i, e in enumerate(events) if i % 2 == 0)]
    labels.append(Msg(0, 999, b'{"event_id": 5}', events[-1]["event_time"]))
    batch = _window(stream, messages, labels, checkpoint=True)
    labelled = [(e, v) for i, (e, v) in enumerate(zip(events, raw, strict=True)) if i % 2 == 0]
    assert batch.size == len(labelled) == 150
    assert sorted(batch.crcs.tolist()) == sorted(zlib.crc32(v) for _, v in labelled)
    by_crc = {zlib.crc32(v): float(e["is_fraud"]) for e, v in labelled}
    assert [by_crc[c] for c in batch.crcs.tolist()] == batch.targets.tolist()  # each event, its own label
    assert [(m.offset, r.split(":")[0]) for m, r in batch.bad_labels] == [(999, "wrong_type")]
    assert batch.expired == 0 and stream.join.pending == {"events": 150, "labels": 0}
    delta = batch.join_delta  # a first checkpoint: every waiting event is new to the files
    assert sum(len(a) for name, a in delta.items() if name.endswith("/events.new.key")) == 150
    assert sum(int(a[3]) for name, a in delta.items() if name.endswith("/events.range")) == 150


def test_a_label_read_before_its_event_waits_and_a_second_event_with_its_id_is_refused():
    stream = _stream()
    event = BankingSimulator(5).events(1)[0]
    value = encode_batch([event], with_label=False)[0]
    label = Msg(1, 0, encode_label(event["event_id"], True, event["event_time"] + 10), event["event_time"] + 10)
    first = _window(stream, [], [label])
    assert first.size == 0 and stream.join.pending == {"events": 0, "labels": 1}
    again = _window(stream, [Msg(1, 0, value, event["event_time"])], [])
    assert again.size == 1 and again.targets.tolist() == [1.0] and not again.bad
    twin = json.dumps({**json.loads(value), "amount": 1.0}).encode()
    _window(stream, [Msg(1, 1, value, event["event_time"])], [])  # waits: its label was used
    refused = _window(stream, [Msg(1, 2, twin, event["event_time"])], [])
    assert [(m.offset, r.split(":")[0]) for m, r in refused.bad] == [(2, "duplicate_event")]
