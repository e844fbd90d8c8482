"""Opening a declared queue for Dagster: provisioned on first use.

The processing loop itself is the library's (:func:`kmq_dagster.spark.processing.run_processing`),
the same one `kmq spark` runs.
"""

from __future__ import annotations

import logging

from kmq_dagster.core.queue import Queue
from kmq_dagster.errors import ProvisionError
from kmq_dagster.kafka.provision import provision_queue
from kmq_dagster.kafka.queues import ensure_provisioned
from kmq_dagster.settings import KmqSettings

log = logging.getLogger(__name__)


def ensure_queue(settings: KmqSettings, queue: Queue) -> Queue:
    """``queue`` as provisioned; provisioned now if it never was (first use).

    Raises:
        QueueConflictError: the queue is provisioned with other settings.
    """
    try:
        return ensure_provisioned(settings, queue)
    except ProvisionError:
        log.info("queue %s is not provisioned yet: provisioning it", queue)
        provision_queue(settings, queue)
        return ensure_provisioned(settings, queue)
