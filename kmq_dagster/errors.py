"""The exception hierarchy: every error kmq raises on purpose is a :class:`KmqError`.

```
KmqError
├── ConfigError               a setting, argument or definition is invalid
│   └── QueueConflictError    two queues would share topics, or a queue's definition disagrees
├── BrokerError               the embedded broker failed, or the broker refused what kmq wrote
│   └── DeliveryError         records were not acknowledged by the broker in time
├── KafkaUnavailableError     no broker answered
│   └── KafkaAuthError        the broker answered, but authentication or TLS failed
├── ProvisionError            topics are missing or do not fit the queue's layout
│   └── TopicDeletedError     a topic was deleted while a tracker or worker used it
├── MarkerDecodeError         bytes on a markers topic are not a marker
├── AuditStoreError           the audit store cannot be opened, migrated or written
├── KmqTimeoutError           work did not finish within its deadline
└── PermissionDeniedError     the acting user's role does not allow the action
```
The command line prints any of these as one line (``kmq: error: ...``) and exits with 1.
"""

from __future__ import annotations


class KmqError(Exception):
    """Root of every error kmq raises on purpose; the CLI prints these as one line."""


class ConfigError(KmqError):
    """A setting, flag or argument is missing or invalid.

    Args:
        message: what is wrong, in the library's terms.
        setting: the name of the setting at fault (a field of :class:`~kmq_dagster.Queue`,
            :class:`~kmq_dagster.KmqSettings` or a policy), so front ends can name their own
            option for it; ``None`` when no single setting is at fault.
    """

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class QueueConflictError(ConfigError):
    """Two queues would share topics, or a queue's given definition contradicts the stored one."""


class BrokerError(KmqError):
    """The embedded broker could not be started or stopped, or the broker refused records."""


class DeliveryError(BrokerError):
    """Records kmq produced were not acknowledged by the broker; nothing was marked done."""


class ReferenceUnresolvedError(KmqError):
    """A dead letter that stands for a message too large to copy (a reference) cannot be
    replayed: the record it points at is gone, unreadable, or not the queue's."""


class ProvisionError(KmqError):
    """Topics could not be created, or existing topics do not fit the queue's layout."""


class TopicDeletedError(ProvisionError):
    """A topic a running tracker or worker needs (its markers topic, a queue topic) was
    deleted under it; it stops rather than go on without a word."""


class KafkaUnavailableError(KmqError):
    """The Kafka cluster did not answer within the timeout."""


class KafkaAuthError(KafkaUnavailableError):
    """The cluster answered, but authentication (SASL) or the TLS handshake failed."""


class MarkerDecodeError(KmqError):
    """Bytes read from a markers topic are not a marker this version understands."""


class AuditStoreError(KmqError):
    """The audit store could not be opened, migrated or written."""


class KmqTimeoutError(KmqError):
    """Work did not finish within its deadline (a batch, a read to the end of a topic)."""


class PermissionDeniedError(KmqError):
    """The acting user's role does not allow this action (e.g. a viewer replaying)."""


class HandlerResultError(KmqError):
    """A handler returned something that means its work never ran (a generator): never
    acknowledged, it goes to the DLQ with this reason (retrying cannot fix it)."""
