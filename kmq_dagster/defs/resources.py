"""Dagster resources: Kafka for kmq, the audit store, and a local Spark configuration.

Clients a resource hands out are closed in its teardown, when the run or sensor tick ends.
"""

from __future__ import annotations

import sys
from typing import Any

from dagster import ConfigurableResource, InitResourceContext
from dagster_pyspark import PySparkResource
from pydantic import Field, PrivateAttr

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.kafka.owned_clients import Consumer, OwnedClients, Producer
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.session import QUIET_LOG4J


class KmqResource(ConfigurableResource):  # type: ignore[type-arg]
    """Kafka connection for kmq; unset fields fall back to the ``KMQ_*`` environment.

    Examples:
        >>> from dagster import Definitions, EnvVar
        >>> defs = Definitions(
        ...     resources={"kmq": KmqResource(bootstrap_servers=EnvVar("KAFKA_BROKERS"))}
        ... )
    """

    bootstrap_servers: str | None = Field(
        default=None, description="host:port list; default KMQ_BOOTSTRAP_SERVERS or 127.0.0.1:9092"
    )
    client_config: dict[str, str] = Field(
        default_factory=dict,
        description="extra confluent-kafka settings such as security.protocol or sasl.* "
        "(pass secrets as EnvVar, so that Dagster shows their names, not their values)",
    )
    session_timeout_ms: int | None = Field(
        default=None, description="consumer group session timeout; default KMQ_SESSION_TIMEOUT_MS"
    )
    _clients: OwnedClients = PrivateAttr(default_factory=OwnedClients)

    def get_settings(self) -> KmqSettings:
        """The :class:`KmqSettings` this resource stands for."""
        return KmqSettings.from_env(
            bootstrap_servers=self.bootstrap_servers,
            client_config=self.client_config,
            session_timeout_ms=self.session_timeout_ms,
        )

    def settings(self) -> KmqSettings:
        """Same as :meth:`get_settings`."""
        return self.get_settings()

    def get_producer(self, **extra: Any) -> Producer:
        """An idempotent producer; flushed and dropped at teardown."""
        return self._clients.producer(self.get_settings(), **extra)

    def get_consumer(self, group: str, **extra: Any) -> Consumer:
        """A consumer in ``group`` that never commits on its own; closed at teardown."""
        return self._clients.consumer(self.get_settings(), group, **extra)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        self._clients.close()


class AuditStoreResource(ConfigurableResource):  # type: ignore[type-arg]
    """The audit store (dead letters, actions, breaker states, alerts, queue snapshots).

    Examples:
        >>> from dagster import EnvVar
        >>> audit = AuditStoreResource(url=EnvVar("KMQ_AUDIT_URL"))
    """

    url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default KMQ_AUDIT_URL or sqlite:///~/.kmq/audit.db",
    )
    _store: AuditStore | None = PrivateAttr(default=None)

    def get_store(self) -> AuditStore:
        """The store, opened (and migrated) on first use; closed at teardown."""
        if self._store is None:
            self._store = AuditStore(self.url)
        return self._store

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def local_spark_config(app_name: str = "kmq", master: str = "local[2]") -> dict[str, Any]:
    """Spark settings for ``PySparkResource(spark_config=...)`` on one machine: loopback only,
    no web UI, quiet logs, executors running this interpreter (which has kmq installed).

    On a cluster give your own: the executors need ``kmq-dagster`` and access to Kafka.
    """
    return {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={QUIET_LOG4J}",
    }


def local_pyspark_resource(app_name: str = "kmq") -> PySparkResource:
    """dagster-pyspark's resource with :func:`local_spark_config`."""
    return PySparkResource(spark_config=local_spark_config(app_name))
