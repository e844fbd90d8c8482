"""The value (and key) formats a queue may declare (defined in :mod:`kmq_dagster.core`, where a
queue's stored definition needs them)."""

from kmq_dagster.core.value_formats import ValueFormat, parse_value_format

__all__ = ["ValueFormat", "parse_value_format"]
