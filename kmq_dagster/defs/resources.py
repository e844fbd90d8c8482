"""Dagster resources: Kafka for kmq, the audit store, and a local Spark configuration.

Clients a resource hands out are closed in its teardown, when the run or sensor tick ends.
"""

from __future__ import annotations

import warnings
from typing import Any

from dagster import ConfigurableResource, InitResourceContext, PreviewWarning
from dagster_pyspark import PySparkResource
from pydantic import Field, PrivateAttr

from kmq_dagster.audit.store import AuditStore
from kmq_dagster.core.queue import Queue
from kmq_dagster.kafka.owned_clients import Consumer, OwnedClients, Producer
from kmq_dagster.kafka.queues import OpenedQueue, open_declared_queue
from kmq_dagster.settings import KmqSettings
from kmq_dagster.spark.session import session_config, start_session

# A dependency's warning, not ours: dagster-pyspark brings dagster-spark, whose
# `dagster_dg_cli.registry_modules` entry point registers its (preview) Spark Declarative
# Pipeline component with `dg`; `dg` instantiates every registered scaffolder when it lists
# or checks components, so each `dg` command printed "Class `SparkDeclarativePipelineScaffolder`
# is currently in preview" (dagster-spark 0.29.27) although no kmq project uses that component.
# This silences exactly that warning, raised where Dagster instantiates the scaffolder; it runs
# where we import dagster-pyspark, which `dg` does when it loads kmq-dagster's own entry point.
warnings.filterwarnings(
    "ignore",
    message=r"Class `SparkDeclarativePipelineScaffolder` is currently in preview",
    category=PreviewWarning,
    module=r"dagster\.components\.scaffold\.scaffold",
)


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

    def open_queue(self, declared: Queue) -> OpenedQueue:
        """``declared`` (a :class:`QueueSpec`'s queue) opened on this resource's cluster, for
        the components to take; its stored definition must be the declared one.

        Raises:
            ProvisionError: the queue is not provisioned (its provision job does that).
            QueueConflictError: it is provisioned with other values than declared.
        """
        return open_declared_queue(self.get_settings(), declared)

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


class KmqSparkResource(PySparkResource):
    """dagster-pyspark's resource, its session started the way every kmq front end starts
    Spark (:func:`~kmq_dagster.spark.session.start_session`): with a local master, the Python
    workers run the interpreter the run runs in, also from a virtualenv that is not activated
    (PySpark itself would start ``python3`` from ``PATH``).

    Examples:
        >>> KmqSparkResource(spark_config=local_spark_config("my-app"))  # doctest: +SKIP
    """

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._spark_session = start_session(self.spark_config)


def local_spark_config(app_name: str = "kmq", master: str = "local[2]") -> dict[str, Any]:
    """Spark settings for :class:`KmqSparkResource` (``spark_config=``) on one machine:
    loopback only, no web UI, quiet logs (:func:`~kmq_dagster.spark.session.session_config`).

    On a cluster give your own: the executors need ``kmq-dagster`` and access to Kafka.
    """
    return dict(session_config(app_name, master))


def local_pyspark_resource(app_name: str = "kmq") -> PySparkResource:
    """A :class:`KmqSparkResource` on local[2] with :func:`local_spark_config`."""
    return KmqSparkResource(spark_config=local_spark_config(app_name))
