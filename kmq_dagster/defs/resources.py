"""The Dagster resource that connects ops, sensors and assets to a kmq queue's Kafka."""

from __future__ import annotations

from dagster import ConfigurableResource
from pydantic import Field

from kmq_dagster.settings import KmqSettings


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
        description="extra confluent-kafka settings such as security.protocol or sasl.*",
    )

    def settings(self) -> KmqSettings:
        """The :class:`KmqSettings` this resource stands for."""
        return KmqSettings.from_env(
            bootstrap_servers=self.bootstrap_servers, client_config=self.client_config
        )
