"""What the ``KmqQueueComponent`` files of one ``dg`` code location share, built once.

Dagster merges the definitions of a project's components with ``Definitions.merge``, which
takes one resource key from several components only when they hand it *the same object*
(``is``, not ``==``). Two components each building their own ``kmq`` resource failed to load
together with Dagster's "Definitions objects 1 and 2 have different resources with same key
'kmq'". Nor can a job, schedule or sensor be handed to both: Dagster's defs.yaml loader gives
each component's definitions a copy carrying that file's metadata, and two copies clash by name.

So the code location's settings are read from all its kmq files at once
(:func:`merge_declarations`: a setting declared in several files must be declared the same, a
file that leaves it out takes the declared one), and the shared part they describe is built
once per code location (:class:`LocationShare`): the first component to build keeps it whole
(resources, daily jobs and schedules, run-failure sensor); every other one adds only the very
same resources object. A share lives as long as the component tree Dagster loads: one per load
of the code location, a new one on every reload, so a defs.yaml is never compared with an older
version of itself.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import dagster as dg
from dagster.components.core.defs_module import ComponentPath
from pydantic import BaseModel

from kmq_dagster.defs.queue_spec import QueueSpec
from kmq_dagster.errors import ConfigError

T = TypeVar("T")
C = TypeVar("C", bound=dg.Component)

#: One share per loaded component tree, keyed by the tree's state tracker: the tree itself is
#: a record (a tuple, equal by value to the tree of an earlier load of the same project, and not
#: weakly referenceable); its tracker is one object per load and goes with the tree.
_SHARES: weakref.WeakKeyDictionary[Any, LocationShare] = weakref.WeakKeyDictionary()
_SHARES_LOCK = threading.Lock()
_MISSING = object()


class LocationShare:
    """The shared part of one code location's kmq components and the queues they declare."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._built: tuple[str, Any] | None = None
        self._queues: dict[tuple[str, str], str] = {}

    def once(self, origin: str, build: Callable[[], T]) -> tuple[T, bool]:
        """The shared part, built by ``build`` for the first component to ask, and whether
        ``origin`` (the asking component's file) owns it: the owner adds it whole to its
        definitions, the others only its resources."""
        with self._lock:
            if self._built is None:
                self._built = (origin, build())
            owner, built = self._built
            return built, owner == origin

    def claim_queues(self, origin: str, specs: Iterable[QueueSpec]) -> None:
        """Record that ``origin`` declares ``specs``.

        Raises:
            ConfigError: another file declares one of these queues (same topic and group) or
                gives a queue the same Dagster name (its jobs, sensors and assets would clash).
        """
        with self._lock:
            for spec in specs:
                wanted = {
                    ("queue", f"{spec.queue.topic} / {spec.queue.group}"): "declare the queue",
                    ("name", spec.name): "give a queue the Dagster name",
                }
                for key, what in wanted.items():
                    other = self._queues.setdefault(key, origin)
                    if other != origin:
                        raise ConfigError(
                            f"{other} and {origin} both {what} {key[1]!r}: declare each queue "
                            "in one defs.yaml (give one of them another `name:` if they are "
                            "different queues)",
                            setting=key[0],
                        )


def location_share(context: dg.ComponentLoadContext) -> LocationShare:
    """The :class:`LocationShare` of the code location ``context`` loads."""
    key = context.component_tree.state_tracker
    with _SHARES_LOCK:
        share = _SHARES.get(key)
        if share is None:
            share = _SHARES[key] = LocationShare()
        return share


def components_of(context: dg.ComponentLoadContext, kind: type[C]) -> list[tuple[str, C]]:
    """Every component of type ``kind`` in the code location, loaded (not built), with its
    file as :func:`origin_of` names it, in the order of their files."""
    tree = context.component_tree
    found: list[tuple[str, C]] = []
    for loc, decl in tree.find_root_decl().iterate_loc_component_decl_pairs():
        if not isinstance(loc, ComponentPath) or not _declares(decl, kind):
            continue
        component = context.load_component(loc)
        if isinstance(component, kind):
            found.append((origin_of(loc, tree.defs_module_path), component))
    return sorted(found, key=lambda pair: pair[0])


def origin_of(loc: ComponentPath, defs_root: Path) -> str:
    """A component's file relative to the defs folder, e.g. ``orders/defs.yaml``."""
    path = loc.file_path
    if path.is_dir():
        found = [path / name for name in ("defs.yaml", "defs.yml", "component.yaml")]
        path = next((p for p in found if p.exists()), path)
    try:
        shown = path.relative_to(defs_root).as_posix()
    except ValueError:
        shown = path.as_posix()
    instance = loc.instance_key
    return shown if instance in (None, 0) else f"{shown} (document {instance})"


def merge_declarations(files: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The code location's settings from what each file declares (``(origin, {setting:
    value})``, a setting left out absent): each setting as the files declaring it declare it.

    Raises:
        ConfigError: two files declare a setting differently; the message names both files
            and the first field that differs (not its values: a field may hold a secret).
    """
    chosen: dict[str, tuple[str, Any]] = {}
    for origin, declared in files:
        for setting, value in declared.items():
            first_origin, first_value = chosen.setdefault(setting, (origin, value))
            difference = _first_difference(_comparable(first_value), _comparable(value))
            if difference is not None:
                field = f"{setting}.{difference}" if difference else setting
                raise ConfigError(
                    f"{first_origin} and {origin} declare different {field}: the "
                    "KmqQueueComponents of a code location share their resources and daily "
                    "jobs, so declare each of `resources` (kafka, audit, spark, alerts) and "
                    "`audit_retention_schedule` the same in every defs.yaml that declares it "
                    "(a file leaving one out takes the declared one)",
                    setting=field,
                )
    return {setting: value for setting, (_origin, value) in chosen.items()}


def _declares(decl: Any, kind: type) -> bool:
    try:
        declared = decl.component_type
    except Exception:
        return False
    return isinstance(declared, type) and issubclass(declared, kind)


def _comparable(value: Any) -> Any:
    """``value`` flattened to ``{"a.b": 1}`` (a model as its fields), so that a difference is
    named down to its field."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return _flattened(value) if isinstance(value, Mapping) else value


def _flattened(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flattened(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def _first_difference(first: Any, second: Any) -> str | None:
    """The first field in which two comparable values differ; ``""``: they differ as a whole;
    ``None``: equal."""
    if first == second:
        return None
    if not (isinstance(first, dict) and isinstance(second, dict)):
        return ""
    names: list[str] = sorted(first.keys() | second.keys())
    return next(name for name in names if first.get(name, _MISSING) != second.get(name, _MISSING))
