"""A queue's settings are described once (``core/queue_settings.py``): the Python API, the
Component's YAML (as Dagster validates a ``defs.yaml``) and the ``kmq`` command take and refuse
the same values in the same words, and none of them forgets a setting.

Every test is parametrized over the tables, so a setting added there is covered here without a
line of test. No broker: options are checked as click parses them, YAML as Dagster validates it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import click
import pytest
from pydantic import ValidationError

from kmq_dagster import BreakerConfig, KmqQueueComponent, Queue, RetryPolicy
from kmq_dagster.cli import cli
from kmq_dagster.cli.setting_options import option_setting
from kmq_dagster.components.queue_model import BreakerModel, QueueModel, RetryModel
from kmq_dagster.core.durations import format_duration_ms
from kmq_dagster.core.queue_settings import (
    BREAKER_SETTINGS,
    MAX_PARTITIONS,
    MAX_VISIBILITY_TIMEOUT_MS,
    PROCESSING_SETTINGS,
    QUEUE_SETTINGS,
    QUEUE_SPEC_SETTINGS,
    RETRY_SETTINGS,
    Kind,
    Setting,
    all_settings,
)
from kmq_dagster.defs import QueueSpec
from kmq_dagster.errors import ConfigError

#: Other settings a value needs beside it to be legal (Python values).
COMPANIONS: dict[str, dict[str, Any]] = {
    "aux_partitions": {"partitions": MAX_PARTITIONS},
    "cooldown_ms": {"max_cooldown_ms": MAX_VISIBILITY_TIMEOUT_MS},
    "max_cooldown_ms": {"cooldown_ms": 1},
    "max_attempts": {"backoff": "1s,2,10m"},
}
BOUNDED = [setting for setting in all_settings() if setting.bounded]
#: Refused first by a rule between two settings in Python: more auxiliary partitions than the
#: queue's (a ``Queue`` is made before the ``QueueSpec`` that checks the upper bound).
RELATION_FIRST = {"aux_partitions": "cannot exceed the queue's"}


def outside(setting: Setting) -> list[float]:
    """Values just out of ``setting``'s bounds (Python's: ms for a duration)."""
    low, high = setting.low, setting.high
    step = 0.001 if setting.kind is Kind.NUMBER else 1
    values: list[float] = []
    if low is not None:
        values.append(low if setting.low_open else low - step)
    if high is not None:
        values.append(high if setting.high_open else high + step)
    if setting.kind is Kind.NUMBER:
        values.append(math.nan)
    return [int(v) if setting.kind is not Kind.NUMBER and math.isfinite(v) else v for v in values]


def inside(setting: Setting) -> list[float]:
    """The values at the edges of ``setting``'s bounds."""
    low, high = setting.low, setting.high
    step = 0.001 if setting.kind is Kind.NUMBER else 1
    values: list[float] = []
    if low is not None:
        values.append(low + step if setting.low_open else low)
    if high is not None and math.isfinite(high):
        values.append(high - step if setting.high_open else high)
    return [int(v) if setting.kind is not Kind.NUMBER else v for v in values]


def text_of(setting: Setting, value: float) -> Any:
    """``value`` as YAML and the command line write it."""
    if setting.kind is Kind.DURATION:
        return format_duration_ms(int(value))
    return value


def python_refusal(setting: Setting, value: float) -> str | None:
    """The Python API's error for ``value`` (``None``: accepted)."""
    given = {**COMPANIONS.get(setting.name, {}), setting.name: value}
    try:
        if setting in RETRY_SETTINGS:
            RetryPolicy(**{name: v for name, v in given.items() if name != "backoff"})
        elif setting in BREAKER_SETTINGS:
            QueueSpec(Queue("orders", "g"), breaker=BreakerConfig(**given))
        elif setting in QUEUE_SETTINGS:
            QueueSpec(Queue("orders", "g", **given))
        else:
            QueueSpec(Queue("orders", "g"), **given)
    except ConfigError as exc:
        assert exc.setting == setting.name, exc
        return str(exc)
    return None


def yaml_refusal(setting: Setting, value: float) -> str | None:
    """The error Dagster's validation of a ``defs.yaml`` gives for ``value``."""
    given = {**COMPANIONS.get(setting.name, {}), setting.name: value}
    table = next(t for t in (RETRY_SETTINGS, BREAKER_SETTINGS, QUEUE_SPEC_SETTINGS) if setting in t)
    yaml = {s.yaml_key: text_of(s, given[s.name]) for s in table if s.name in given}
    queue: dict[str, Any] = {"topic": "orders", "group": "g"}
    if table is RETRY_SETTINGS:
        queue["retry"] = yaml
    elif table is BREAKER_SETTINGS:
        queue["breaker"] = yaml
    else:
        queue.update(yaml)
    try:
        # what Dagster validates a defs.yaml with, then the model the component gets
        KmqQueueComponent.model().model_validate({"queues": [queue]})
        QueueModel.model_validate(queue).spec()
    except ValidationError as exc:
        assert setting.yaml_key in str(exc), exc  # Dagster's message names the field
        return str(exc)
    return None


def options_of(setting: Setting) -> Iterator[tuple[str, click.Command, click.Parameter]]:
    """Every option of ``kmq`` (the benchmarks' shapes aside) taking ``setting``'s flag."""
    for path, command in every_command(cli):
        if "bench" in path:
            continue  # a benchmark's --concurrency is the shape it measures, not a queue's
        for param in command.params:
            if setting.flag in getattr(param, "opts", ()):
                yield path, command, param


def every_command(group: click.Group, path: str = "kmq") -> Iterator[tuple[str, click.Command]]:
    for name, command in sorted(group.commands.items()):
        yield f"{path} {name}", command
        if isinstance(command, click.Group):
            yield from every_command(command, f"{path} {name}")


def cli_refusals(setting: Setting, value: float) -> list[str | None]:
    """What each command with ``setting``'s option says of ``value`` (``None``: accepted)."""
    said: list[str | None] = []
    for _path, command, param in options_of(setting):
        try:
            param.process_value(click.Context(command), str(text_of(setting, value)))
        except click.BadParameter as exc:
            said.append(exc.message)
        else:
            said.append(None)
    return said


@pytest.mark.parametrize("setting", BOUNDED, ids=lambda s: s.name)
def test_each_bound_is_enforced_alike_by_python_yaml_and_the_command_line(
    setting: Setting,
) -> None:
    for value in outside(setting):
        phrase = setting.refusal(value)
        assert phrase is not None, (setting.name, value)
        refusals = [python_refusal(setting, value), yaml_refusal(setting, value)]
        if setting.flag:
            refusals += cli_refusals(setting, value)
        if setting.name in RELATION_FIRST and RELATION_FIRST[setting.name] in str(refusals[0]):
            refusals = refusals[1:]
        for refusal in refusals:
            assert refusal is not None and phrase in refusal, (value, refusals)

    for value in inside(setting):
        accepted = [python_refusal(setting, value), yaml_refusal(setting, value)]
        if setting.flag:
            accepted += cli_refusals(setting, value)
        assert accepted == [None] * len(accepted), (value, accepted)


def test_the_yaml_schema_has_every_setting() -> None:
    for model, table in (
        (QueueModel, QUEUE_SPEC_SETTINGS),
        (RetryModel, RETRY_SETTINGS),
        (BreakerModel, BREAKER_SETTINGS),
    ):
        assert set(model.model_fields) == {setting.yaml_key for setting in table}
        described = model.model_json_schema()["properties"]
        assert all(described[s.yaml_key].get("description") for s in table)
    queues = KmqQueueComponent.model().model_json_schema()
    assert all(f"'{key}'" in str(queues) for key in QueueModel.model_fields)  # Dagster's, from it


def test_the_python_api_has_every_setting() -> None:
    def fields(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    assert fields(Queue) == {s.name for s in QUEUE_SETTINGS}
    assert fields(QueueSpec) - {"queue"} == {s.name for s in PROCESSING_SETTINGS}
    assert fields(BreakerConfig) == {s.name for s in BREAKER_SETTINGS}
    assert {s.name for s in RETRY_SETTINGS if s.bounded} <= fields(RetryPolicy)


@pytest.mark.parametrize("setting", [s for s in all_settings() if s.flag], ids=lambda s: s.name)
def test_every_option_of_a_setting_is_built_from_it(setting: Setting) -> None:
    found = list(options_of(setting))

    assert found, f"no kmq command takes {setting.flag}"
    if setting.bounded or setting.kind is Kind.CHOICE:
        for path, _, param in found:
            assert option_setting(param) == setting, f"{path} {setting.flag} declares its own"
