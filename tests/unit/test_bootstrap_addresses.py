"""Which addresses kmq probes for a refused connection before it gives up early."""

from __future__ import annotations

from kmq_dagster.kafka.clients import bootstrap_addresses


def test_a_bootstrap_list_gives_host_and_port_of_each_entry() -> None:
    assert bootstrap_addresses("a:9092, [::1]:9093,SSL://b.example:9094") == [
        ("a", 9092),
        ("::1", 9093),
        ("b.example", 9094),
    ]


def test_an_entry_without_a_port_means_nothing_is_concluded() -> None:
    assert bootstrap_addresses("a:9092,b") is None
    assert bootstrap_addresses("a:port") is None
