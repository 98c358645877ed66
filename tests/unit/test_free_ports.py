"""Loopback ports for the processes the project starts (streamlearn/kafka/broker.py): a head
node's five listeners once got the same port twice from two draws, and `ray start` refused it."""

from __future__ import annotations

import socket

from streamlearn.kafka import broker
from streamlearn.kafka.broker import free_port, free_ports


def test_ports_drawn_by_one_process_never_repeat():
    drawn = [p for _ in range(100) for p in free_ports(5)] + [free_port() for _ in range(100)]
    assert len(set(drawn)) == len(drawn) == 600
    assert all(20000 <= p < 32768 for p in drawn)  # below the kernel's ephemeral range


def test_a_port_in_use_is_skipped(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        spare = free_port()
        broker._GIVEN.discard(spare)
        monkeypatch.setattr(broker.random, "sample", lambda population, k: [busy, spare])
        assert free_ports(1) == [spare]
