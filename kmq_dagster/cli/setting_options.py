"""The ``kmq`` options of a queue's settings, built from their one description
(:mod:`kmq_dagster.core.queue_settings`): the flag, the value type with its bounds and the help
text come from there, so a command refuses a value with the words the Python API and the
Component's YAML use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click
from click.decorators import FC

from kmq_dagster.core.durations import format_duration_ms
from kmq_dagster.core.queue_settings import Kind, Setting
from kmq_dagster.errors import ConfigError

#: The metavar of a setting's option, by kind.
_METAVARS = {
    Kind.DURATION: "DURATION",
    Kind.TEXTS: "LIST",
    Kind.CALLABLE: "MODULE:FUNCTION",
    Kind.INT: "INTEGER",
    Kind.NUMBER: "NUMBER",
}


class SettingType(click.ParamType[Any, Any]):
    """A command-line value of ``setting``, parsed and checked by the setting itself."""

    def __init__(self, setting: Setting) -> None:
        self.setting = setting
        self.name = setting.kind.value

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value  # a default, already a value
        try:
            return self.setting.parse(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class SettingChoice(click.Choice[str]):
    """One of a :attr:`Kind.CHOICE` setting's choices."""

    def __init__(self, setting: Setting) -> None:
        super().__init__(setting.choices)
        self.setting = setting


def setting_option(
    setting: Setting,
    *,
    help: str | None = None,
    note: str = "",
    short: str | None = None,
    param: str | None = None,
    **click_options: Any,
) -> Callable[[FC], FC]:
    """The option ``setting.flag`` taking ``setting``'s value.

    Args:
        help: the command's sentence instead of the setting's phrase.
        note: appended to the help, e.g. ``[default 30s]``.
        short: a short flag too, e.g. ``-p``.
        param: the command function's parameter, if not the flag's name.
        click_options: more of ``click.option``'s keywords (``default``, ``required``).
    """
    if setting.flag is None:
        raise ValueError(f"the command line does not take {setting.name}")
    kind_type = SettingChoice(setting) if setting.kind is Kind.CHOICE else SettingType(setting)
    text = help or setting.help[:1].upper() + setting.help[1:] + "."
    if note:
        text += " " + note
    click_options.setdefault("metavar", _METAVARS.get(setting.kind))
    decls = [*([param] if param else []), setting.flag, *([short] if short else [])]
    return click.option(*decls, type=kind_type, help=text, **click_options)


def shown_default(cls: type, setting: Setting) -> str:
    """``setting``'s default on the dataclass ``cls``, as the command line writes it."""
    (field,) = [f for f in dataclasses.fields(cls) if f.name == setting.name]
    value: Any = field.default
    if setting.kind is Kind.DURATION:
        return format_duration_ms(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def option_setting(param: click.Parameter) -> Setting | None:
    """The setting an option was built from (``None``: not from one)."""
    kind = getattr(param, "type", None)
    return kind.setting if isinstance(kind, (SettingType, SettingChoice)) else None
