"""librdkafka's mock cluster as the second Kafka protocol implementation the tests can run on.

``KMQ_TEST_BOOTSTRAP=mock python -m pytest ...`` runs the kafka tests against a mock cluster
(``test.mock.num.brokers``) that lives inside this test process and serves real TCP on
loopback, so ``kmq`` child processes can use it too. What it cannot do, measured with
confluent-kafka 2.16 (librdkafka 2.16):

* CreateTopics: its metadata names no controller, so the admin API times out waiting for one;
  topics are auto-created on first use instead, always with :data:`MOCK_PARTITIONS`
  partitions, so queues get that many (tests that need another count are skipped);
* a restart, a stall or a durable data dir: the cluster lives and dies with this process.
"""

from __future__ import annotations

import os
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kmq_dagster.kafka.provision import ProvisionPlan, ProvisionReport

#: The environment variable and value that select the mock cluster.
BOOTSTRAP_ENV = "KMQ_TEST_BOOTSTRAP"
MOCK = "mock"
#: Partitions of every topic the mock cluster creates.
MOCK_PARTITIONS = 4
#: Brokers of the mock cluster.
MOCK_BROKERS = 3


def mock_selected() -> bool:
    """True when the tests run on the mock cluster."""
    return os.environ.get(BOOTSTRAP_ENV, "") == MOCK


class MockCluster:
    """A mock cluster kept alive by the client that created it (until :meth:`close`)."""

    def __init__(self) -> None:
        self._owner = AdminClient(
            {"test.mock.num.brokers": MOCK_BROKERS, "bootstrap.servers": "", "log_level": 0}
        )
        brokers = self._owner.list_topics(timeout=10).brokers.values()
        self.bootstrap_servers = ",".join(f"{b.host}:{b.port}" for b in brokers)
        self._creator = Producer({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})

    def create_topics(self, _settings: object, plan: ProvisionPlan) -> ProvisionReport:
        """Stands in for kmq's topic creation (carrying out ``plan``): asks for each topic's
        metadata, which makes the mock cluster create it; waits until all are there."""
        wanted = [planned.name for planned in plan.topics]
        names = [*wanted, plan.registry.name]
        existing = set(self._creator.list_topics(timeout=10).topics)
        deadline = time.monotonic() + 30
        while not set(names) <= existing and time.monotonic() < deadline:
            for name in set(names) - existing:
                self._creator.list_topics(topic=name, timeout=10)
            existing = set(self._creator.list_topics(timeout=10).topics)
        missing = [name for name in wanted if name not in existing]
        report = ProvisionReport(partitions=MOCK_PARTITIONS, plan=plan)
        report.created = [name for name in wanted if name not in missing]
        return report

    def stop(self) -> None:
        self._creator.flush(5)
