"""The exception hierarchy: every error kmq raises on purpose is a :class:`KmqError`."""

from __future__ import annotations


class KmqError(Exception):
    """Root of every error kmq raises on purpose; the CLI prints these as one line."""


class ConfigError(KmqError):
    """A setting, flag or argument is missing or invalid."""


class BrokerError(KmqError):
    """The embedded broker could not be started, reached or stopped."""


class ProvisionError(KmqError):
    """Topics could not be created, or existing topics do not fit the queue's layout."""


class KafkaUnavailableError(KmqError):
    """The Kafka cluster did not answer within the timeout."""


class MarkerDecodeError(KmqError):
    """Bytes read from a markers topic are not a marker this version understands."""


class PermissionDeniedError(KmqError):
    """The acting user's role does not allow this action (e.g. a viewer replaying)."""
