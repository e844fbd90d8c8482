"""One queue as a ``defs.yaml`` declares it, turned into the :class:`QueueSpec` that
``kmq_definitions`` takes: the YAML path and the Python path build the same definitions.

The fields are made from the settings' one description (:mod:`kmq_dagster.core.queue_settings`):
a setting's key, type, description and bounds check come from there, so Dagster's validation
names the field that is out of bounds, in the words the Python API and the ``kmq`` command use.
Durations are written as the ``kmq`` command writes them (``30s``, ``1m``, ``1h30m``). A field
left out keeps the Python default: no default is repeated here.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from typing import Annotated, Any, Literal

import dagster as dg
from pydantic import AfterValidator, Field, create_model
from pydantic.fields import FieldInfo

from kmq_dagster.core.breaker import BreakerConfig
from kmq_dagster.core.queue import DEFAULT_RETRY_DELAYS_MS, Queue
from kmq_dagster.core.queue_settings import (
    BREAKER_SETTINGS,
    PROCESSING_SETTINGS,
    QUEUE_SETTINGS,
    RETRY_SETTINGS,
    Kind,
    Setting,
)
from kmq_dagster.core.retry import RetryPolicy
from kmq_dagster.defs.queue_spec import QueueSpec
from kmq_dagster.errors import ConfigError

#: ``freshness_minutes: auto``: derive the window from the queue's intervals.
AUTO = "auto"

#: The YAML type of a setting of each kind (a group's is its own model, see ``_GROUP_MODELS``).
_YAML_TYPES: dict[Kind, Any] = {
    Kind.INT: int,
    Kind.NUMBER: float,
    Kind.DURATION: str,
    Kind.TEXT: str,
    Kind.TEXTS: list[str],
    Kind.FLAG: bool,
    Kind.CALLABLE: str,
}


def _bounds_check(setting: Setting) -> Callable[[Any], Any]:
    """Pydantic's validator of ``setting``: its one bounds check, as a ``ValueError`` that
    Dagster reports with the file and the field."""

    def in_bounds(value: Any) -> Any:
        if isinstance(value, str) and ("{{" in value or setting.kind is not Kind.DURATION):
            # a template ({{ env(...) }}) is checked once Dagster has resolved it; a number
            # written as text is pydantic's to refuse as not a number
            return value
        try:
            why = setting.refused(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if why is not None:
            raise ValueError(why)
        return value

    return in_bounds


def yaml_fields(settings: tuple[Setting, ...]) -> dict[str, tuple[Any, FieldInfo]]:
    """The pydantic fields (annotation, field info) of ``settings``, keyed by YAML key."""
    fields: dict[str, tuple[Any, FieldInfo]] = {}
    for setting in settings:
        if setting.kind is Kind.GROUP:
            kind: Any = _GROUP_MODELS[setting.yaml_key]
        elif setting.kind is Kind.CHOICE:
            kind = Literal[setting.choices]
        else:
            kind = _YAML_TYPES[setting.kind]
        if setting.extra:
            kind = kind | Literal[setting.extra]
        description = setting.help + (
            f"; default {setting.default_note}" if setting.default_note else ""
        )
        default: Any = None
        if setting.off:
            annotation, default = kind | bool, True
            description += "; true: its defaults"
        elif setting.required:
            annotation, default = kind, ...
        else:
            annotation = kind | None
        if setting.bounded:
            annotation = Annotated[annotation, AfterValidator(_bounds_check(setting))]
        fields[setting.yaml_key] = (annotation, Field(default=default, description=description))
    return fields


class _YamlModel(dg.Resolvable, dg.Model):
    """A model whose fields are made from settings (``yaml_fields``)."""


def _fields_model(name: str, settings: tuple[Setting, ...]) -> Any:
    return create_model(name, __base__=_YamlModel, **yaml_fields(settings))  # type: ignore[call-overload]


class RetryModel(_fields_model("RetryFields", RETRY_SETTINGS)):  # type: ignore[misc]
    """When a failed message is retried: ``delays`` or ``backoff`` (as ``kmq provision``)."""

    def policy(self) -> RetryPolicy:
        """The :class:`RetryPolicy` these fields describe.

        Raises:
            ConfigError: contradictory or malformed values.
        """
        given = python_values(self, RETRY_SETTINGS)
        non_retryable = given.pop("non_retryable", ())
        if "delays" in given:
            given["delays"] = ",".join(given["delays"])  # as the command line writes them
        return RetryPolicy.from_options(
            **given, default_delays_ms=DEFAULT_RETRY_DELAYS_MS
        ).with_non_retryable(non_retryable)


class BreakerModel(_fields_model("BreakerFields", BREAKER_SETTINGS)):  # type: ignore[misc]
    """When the group's circuit breaker opens and how it probes (:class:`BreakerConfig`)."""

    def config(self) -> BreakerConfig:
        """The :class:`BreakerConfig` with these values, its defaults for the rest."""
        return BreakerConfig(**python_values(self, BREAKER_SETTINGS))


#: The model of each group of settings, by YAML key.
_GROUP_MODELS: dict[str, Any] = {"retry": RetryModel, "breaker": BreakerModel}


class QueueModel(_fields_model("QueueFields", QUEUE_SETTINGS + PROCESSING_SETTINGS)):  # type: ignore[misc]
    """One queue: what ``QueueSpec(Queue(...), ...)`` declares in Python."""

    def spec(self) -> QueueSpec:
        """The :class:`QueueSpec` this queue declares.

        Raises:
            ConfigError: a value out of range, a malformed duration, or a function or
                transform that cannot be imported (the message names the queue and field).
        """
        try:
            return self._spec()
        except ConfigError as exc:
            raise ConfigError(
                f"queue {self.topic} / {self.group}: {exc}", setting=exc.setting
            ) from None

    def _spec(self) -> QueueSpec:
        queue = Queue(**python_values(self, QUEUE_SETTINGS))
        given = python_values(self, PROCESSING_SETTINGS)
        freshness = given.pop("freshness_minutes", None)
        spec = QueueSpec(queue, **given)
        if freshness is None:
            return spec
        minutes = auto_freshness_minutes(spec) if freshness == AUTO else int(freshness)
        return dataclasses.replace(spec, freshness_minutes=minutes)


def python_values(model: Any, settings: tuple[Setting, ...]) -> dict[str, Any]:
    """The Python API's keywords for the YAML values ``model`` holds of ``settings``; one left
    out is left out (the Python default holds).

    Raises:
        ConfigError: a malformed duration, or a function or transform that cannot be imported.
    """
    values: dict[str, Any] = {}
    for setting in settings:
        given = getattr(model, setting.yaml_key)
        if given is None:
            continue
        if setting.kind is Kind.DURATION:
            given = setting.parse(given)
        elif setting.kind is Kind.CALLABLE:
            given = _imported(setting.yaml_key, given)
        elif isinstance(given, RetryModel):
            given = given.policy()
        elif setting.off and isinstance(given, bool):
            given = BreakerConfig() if given else None  # false is a choice: no breaker sensor
        elif isinstance(given, BreakerModel):
            given = given.config()
        values[setting.name] = given
    return values


def auto_freshness_minutes(spec: QueueSpec) -> int:
    """How late a message can be processed when nothing is wrong, in whole minutes: it waits
    up to one backlog interval for a run to start, and a run may work up to its maximum run
    time through an older backlog first."""
    return max(1, math.ceil((spec.backlog_interval_s + spec.max_run_seconds) / 60))


def _imported(setting: str, path: str) -> Callable[..., Any]:
    """The callable at ``pkg.module.name`` (or ``pkg.module:name``)."""
    module_name, _, attribute = path.replace(":", ".").rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{setting}: cannot import {path!r} ({exc})", setting=setting) from None
    if not callable(found):
        raise ConfigError(f"{setting}: {path!r} is not callable", setting=setting)
    return found  # type: ignore[no-any-return]


__all__ = ["AUTO", "BreakerModel", "QueueModel", "RetryModel", "auto_freshness_minutes"]
