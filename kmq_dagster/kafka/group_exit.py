"""Leaving a consumer group before closing the client, so that the close serves no rebalance.

Why a lease does not simply call ``Consumer.close()``: when the group takes partitions back,
librdkafka hands them to the application's rebalance callback. When that callback did not
assign or unassign itself (the leases' revoke callbacks don't), confluent-kafka does it after
the callback, and first asks the group subsystem which rebalance protocol it runs
(``rd_kafka_rebalance_protocol``), holding the GIL while it waits for the answer. ``close()``
serves such rebalances after it has told the group subsystem to terminate, and a terminated
subsystem drops questions without answering. When the subsystem wins that race, the close waits
forever with the GIL held, and every thread of the process stops with it: no join deadline, no
signal handler, no test timeout can run. It happened once in CI (stop 57), to a tracker stopped
just after the other tracker of its group left.

So a member leaves first: it pauses its partitions, unsubscribes, and serves the rebalance
that takes them back on its own polls, while the group subsystem still runs. Its close then
has nothing left to revoke.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException

log = logging.getLogger(__name__)

#: Seconds one poll waits for the group's revoke while leaving.
LEAVE_POLL_S = 0.05
#: Longest a member waits for the group to take its partitions back before it closes anyway.
LEAVE_WAIT_S = 10.0


def leave_group(
    consumer: Consumer, timeout_s: float, holds_partitions: Callable[[], bool] | None = None
) -> bool:
    """Pause ``consumer``'s partitions, unsubscribe, and poll until the group took them back.

    A record a poll returns meanwhile (one fetched before the pause) is dropped unhandled and
    uncommitted, as a stopping member drops what it has not handled: the partition's next
    owner reads it again.

    Args:
        timeout_s: longest to wait for the revoke, in seconds.
        holds_partitions: whether the group's last assignment to this member has not been
            revoked yet; by default, whether the client has partitions assigned. (Under the
            eager protocol even an empty assignment is revoked: a member that can get one
            says so here.)

    Returns:
        True when the member holds nothing any more, False when ``timeout_s`` passed first.
    """
    holds = holds_partitions or (lambda: bool(consumer.assignment()))
    deadline = time.monotonic() + timeout_s
    try:
        consumer.pause(consumer.assignment())
        consumer.unsubscribe()
        while holds():
            if time.monotonic() >= deadline:
                log.warning("the group did not take this member's partitions back within "
                            "%.0f s", timeout_s)  # fmt: skip
                return False
            consumer.poll(LEAVE_POLL_S)
    except (KafkaException, RuntimeError) as exc:  # closed already, or a fatal client error
        log.info("leaving the group before the close failed: %s", exc)
        return False
    return True
