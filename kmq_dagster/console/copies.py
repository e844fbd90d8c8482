"""What became of replayed copies: failed again (the store knows), or picked up by the group
(its committed offset is past the copy), or still waiting for it (Kafka knows)."""

from __future__ import annotations

from kmq_dagster.audit.history import HistoryEntry
from kmq_dagster.audit.history_events import REPLAY
from kmq_dagster.kafka.group_offsets import committed_offsets
from kmq_dagster.settings import KmqSettings


def copy_fates(settings: KmqSettings, group: str, entries: list[HistoryEntry]) -> dict[int, str]:
    """Per replay entry (by its index in ``entries``), what became of its copy.

    Raises:
        KafkaUnavailableError: the group's offsets could not be read.
    """
    replays = {
        index: entry
        for index, entry in enumerate(entries)
        if entry.kind == REPLAY and entry.copy_topic is not None
    }
    waiting = [(e.copy_topic or "", e.copy_partition or 0) for e in replays.values()]
    positions = committed_offsets(settings, group, sorted(set(waiting)))
    fates: dict[int, str] = {}
    for index, entry in replays.items():
        committed = positions.get((entry.copy_topic or "", entry.copy_partition or 0))
        if entry.came_back_as is not None:
            fates[index] = f"failed again: dead letter #{entry.came_back_as}"
        elif committed is not None and committed > (entry.copy_offset or 0):
            fates[index] = f"picked up by {group}; not dead-lettered again"
        else:
            fates[index] = f"waiting for {group} (committed there: {committed})"
    return fates
