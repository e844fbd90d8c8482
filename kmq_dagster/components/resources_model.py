"""The resources of a :class:`KmqQueueComponent` (Kafka, audit store, PySpark, alerts) as its
``defs.yaml`` declares them.

Values take Dagster's template syntax. A value written as exactly ``"{{ env.NAME }}"`` becomes
``EnvVar("NAME")``: Dagster reads the variable when a run or a sensor tick starts and shows only
its name in the UI, as a Python user writing ``EnvVar`` gets; so a password never sits in the
YAML nor on the Resources page (and an unset variable fails the run, naming it). Other
templates (``"{{ env('NAME', 'default') }}"``, text around the braces) are resolved when the
code location loads, as Dagster always does.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import dagster as dg
from dagster_pyspark import PySparkResource
from pydantic import Field

from kmq_dagster.defs.alerts import KmqAlertsResource
from kmq_dagster.defs.resources import (
    AuditStoreResource,
    KmqResource,
    KmqSparkResource,
    local_spark_config,
)

#: ``{{ env.NAME }}`` and nothing else: read at run time through ``EnvVar``.
_ONLY_AN_ENV_VAR = re.compile(r"\{\{\s*env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def resolve_setting(context: dg.ResolutionContext, raw: Any) -> Any:
    """``"{{ env.NAME }}"`` kept as written (:func:`setting` makes it an ``EnvVar`` when the
    resource is built); any other value resolved as Dagster resolves templates."""
    if isinstance(raw, str) and _ONLY_AN_ENV_VAR.fullmatch(raw.strip()):
        return raw.strip()
    return context.resolve_value(raw)


def resolve_settings(context: dg.ResolutionContext, raw: Any) -> Any:
    """:func:`resolve_setting` on each value of a mapping (client settings, Spark settings)."""
    if not isinstance(raw, dict):
        return context.resolve_value(raw)
    return {key: resolve_setting(context.at_path(key), value) for key, value in raw.items()}


def setting(value: str | None) -> str | None:
    """A resolved setting as a resource takes it: ``EnvVar(NAME)`` for ``"{{ env.NAME }}"``."""
    whole = None if value is None else _ONLY_AN_ENV_VAR.fullmatch(value)
    return value if whole is None else dg.EnvVar(whole.group(1))


def settings(values: dict[str, str]) -> dict[str, str]:
    """:func:`setting` on each value (pydantic keeps ``str`` subclasses only as ``str``)."""
    return {key: setting(value) or "" for key, value in values.items()}


#: A text setting that may be ``"{{ env.NAME }}"``; ``None``: the resource's default.
Setting = Annotated[
    str | None,
    dg.Resolver(resolve_setting, model_field_type=str | None, inject_before_resolve=False),
]
#: A mapping of text settings, each of which may be ``"{{ env.NAME }}"``.
Settings = Annotated[dict[str, str], dg.Resolver(resolve_settings, model_field_type=dict[str, str])]


class KafkaModel(dg.Resolvable, dg.Model):
    """Kafka for kmq (:class:`KmqResource`); unset: the ``KMQ_*`` environment."""

    bootstrap_servers: Setting = None
    client_config: Settings = Field(
        default_factory=dict, description="confluent-kafka settings, e.g. security.protocol"
    )
    session_timeout_ms: int | None = None

    def resource(self) -> KmqResource:
        return KmqResource(
            bootstrap_servers=setting(self.bootstrap_servers),
            client_config=settings(self.client_config),
            session_timeout_ms=self.session_timeout_ms,
        )


class AuditModel(dg.Resolvable, dg.Model):
    """The audit store (:class:`AuditStoreResource`); unset: ``KMQ_AUDIT_URL`` or SQLite."""

    url: Setting = Field(default=None, description="SQLAlchemy URL")

    def resource(self) -> AuditStoreResource:
        return AuditStoreResource(url=setting(self.url))


class SparkModel(dg.Resolvable, dg.Model):
    """The SparkSession of processing runs (:class:`KmqSparkResource`)."""

    app_name: str = "kmq"
    master: str = Field(default="local[2]", description="e.g. spark://host:7077")
    config: Settings = Field(default_factory=dict, description="more Spark settings")

    def resource(self) -> PySparkResource:
        return KmqSparkResource(
            spark_config={
                **local_spark_config(self.app_name, self.master),
                **settings(self.config),
            }
        )


class AlertsModel(dg.Resolvable, dg.Model):
    """Where alerts go besides the Dagster log (:class:`KmqAlertsResource`)."""

    webhook_url: Setting = None
    slack_token: Setting = None
    slack_channel: str | None = None
    smtp_host: Setting = None
    smtp_port: int | None = None
    smtp_sender: str | None = None
    smtp_recipients: list[str] | None = None
    smtp_username: Setting = None
    smtp_password: Setting = None
    smtp_starttls: bool | None = None
    min_period_s: float | None = None

    def resource(self) -> KmqAlertsResource:
        given: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None:
                given[name] = setting(value) if isinstance(value, str) else value
        return KmqAlertsResource(**given)


class ResourcesModel(dg.Resolvable, dg.Model):
    """Every resource of the component; each one left out gets its Python default."""

    kafka: KafkaModel | None = None
    audit: AuditModel | None = None
    spark: SparkModel | None = None
    alerts: AlertsModel | None = None

    def given(self) -> dict[str, dg.Model]:
        """The resources this file declares (one left out or ``null`` is absent): the
        components of a code location share one set of resources, each declared in one file
        or the same in several. ``"{{ env.NAME }}"`` stays as written, so a secret is compared
        by its variable's name."""
        models = {name: getattr(self, name) for name in type(self).model_fields}
        return {name: model for name, model in models.items() if model is not None}

    def resources(self) -> dict[str, Any]:
        """``kmq_definitions``' keyword arguments (``None``: its default)."""
        return {
            "kmq": self.kafka and self.kafka.resource(),
            "audit": self.audit and self.audit.resource(),
            "pyspark": self.spark and self.spark.resource(),
            "alerts": self.alerts and self.alerts.resource(),
        }
