"""The counters of a ``KmqConsumer``, shared by the parts that write its markers and commits."""

from __future__ import annotations

from dataclasses import dataclass, field

from kmq_dagster.kafka.clients import ClientErrors


@dataclass
class ConsumerStats:
    """Counters an operator or a test reads; never reset."""

    fetched: int = 0
    acked: int = 0
    nacked: int = 0
    start_markers: int = 0
    end_markers: int = 0
    marker_write_failures: int = 0
    #: Objects passed to ack() that no consumer handed out (logged, then ignored).
    invalid_acks: int = 0
    commit_failures: int = 0
    client_errors: ClientErrors = field(default_factory=ClientErrors)
