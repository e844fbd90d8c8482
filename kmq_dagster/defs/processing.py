"""Opening a declared queue for Dagster: provisioned on first use.

The processing loop itself is the library's (:func:`kmq_dagster.spark.processing.run_processing`),
the same one `kmq spark` runs.
"""

from __future__ import annotations

import logging

from kmq_dagster.core.queue import Queue
from kmq_dagster.errors import ProvisionError
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.queues import OpenedQueue, open_declared_queue
from kmq_dagster.settings import KmqSettings

log = logging.getLogger(__name__)


def ensure_queue(settings: KmqSettings, queue: Queue) -> OpenedQueue:
    """``queue`` opened as provisioned; provisioned now if it never was (first use).

    Raises:
        QueueConflictError: the queue is provisioned with other settings.
    """
    try:
        return open_declared_queue(settings, queue)
    except ProvisionError:
        log.info("queue %s is not provisioned yet: provisioning it", queue)
        return provision_queue(settings, queue).opened
