"""What a redelivery tracker holds: its counters, and its state per markers partition."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from kmq_dagster.core.inflight import MessageRef, PartitionInflight
from kmq_dagster.kafka.clients import ClientErrors


@dataclass
class TrackerStats:
    """Counters an operator or a test reads; never reset."""

    markers: int = 0
    bad_markers: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    records_gone: int = 0
    produce_failures: int = 0
    #: Copies refused for their size, dead-lettered as references instead.
    oversize: int = 0
    client_errors: ClientErrors = field(default_factory=ClientErrors)
    #: Unacknowledged messages of the owned partitions, as of the last commit (each second).
    in_flight: int = 0
    #: Deadline of the oldest open start marker, as of the last commit; ``None``: none open.
    oldest_open_deadline_ms: int | None = None


@dataclass
class MarkersPartitionState:
    """One owned markers partition: its in-flight messages and how far it has been read."""

    inflight: PartitionInflight = field(default_factory=PartitionInflight)
    #: Read to its end since it was assigned (step 6): only then is anything redelivered.
    caught_up: bool = False
    #: The offset after the last marker read; ``None``: nothing read yet.
    next_offset: int | None = None
    #: Reads of a record that neither found it nor ruled it out, per message.
    undecided_reads: dict[MessageRef, int] = field(default_factory=lambda: defaultdict(int))
