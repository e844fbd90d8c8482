"""Checks on the raw command line, before click parses it.

Two things cannot wait for the parsed options:

* **Secrets.** A password typed into ``-X``, ``-b`` or a URL must be masked in every line kmq
  prints, including click's own usage errors for a malformed command line, which are raised
  before any setting is read. So the secrets the raw arguments hold are registered first
  (:func:`register_argv_secrets`), and every error line is masked by
  :func:`kmq_dagster.secrets.mask_text`.
* **Bytes that are not UTF-8.** On POSIX an argument is bytes; Python keeps undecodable ones as
  lone surrogates, which no Kafka client, terminal or SQL store can encode. Such an argument
  is refused with the option it belongs to (:func:`first_undecodable_argument`); ``kmq send``
  takes arbitrary bytes from files (``--value-file``, ``--key-file``, ``--header-file``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import click

from kmq_dagster.secrets import is_secret_name, register_secret, register_url_secrets

#: Options whose value is a URL that may carry a password.
_URL_OPTIONS = frozenset({"--audit-url", "--postgres-url"})
#: Where ``kmq send`` takes the bytes an argument cannot carry.
_BYTES_OPTION = {"--value": "--value-file", "--key": "--key-file", "-k": "--key-file"}
_CLIENT_SETTING = re.compile(r"[A-Za-z0-9_.-]+")
_SURROGATE = re.compile("[\ud800-\udfff]")


def register_argv_secrets(argv: Sequence[str], command: click.Group) -> None:
    """Register every secret the raw arguments hold, however malformed they are.

    ``-X name=value`` with a secret-looking name (also mistyped ``name:value``, or as two
    arguments ``-X name value``), ``-X =value`` (no name: the value may be anything), the
    password of ``-b user:password@host`` and of a URL option.
    """
    for option, value, following in _option_values(argv):
        if option == "-X":
            name, separator, setting = _split_setting(value)
            if separator and (not name.strip() or is_secret_name(name)):
                register_secret(setting)
            elif not separator and is_secret_name(name) and _is_loose_value(following, command):
                register_secret(following)
        elif option in ("-b", "--bootstrap-servers"):
            for server in value.split(","):
                credentials, at, _host = server.rpartition("@")
                if at:
                    register_secret(credentials.partition(":")[2] or credentials)
        elif option in _URL_OPTIONS:
            register_url_secrets(value)


def first_undecodable_argument(argv: Sequence[str], command: click.Group) -> str | None:
    """The error line for the first argument that is not UTF-8 text, or ``None``.

    The line names the option the argument is the value of and, for ``kmq send``'s message
    options, the option that takes the same data as bytes.
    """
    value_options = _value_options(command)
    for index, argument in enumerate(argv):
        match = _SURROGATE.search(argument)
        if match is None:
            continue
        option = _owner(argv, index, value_options)
        byte = ord(match.group()) - 0xDC00 if 0xDC80 <= ord(match.group()) <= 0xDCFF else None
        what = f" (byte 0x{byte:02x})" if byte is not None else ""
        line = f"{option}: the argument is not UTF-8 text{what}"
        if "send" in argv and (option in _BYTES_OPTION or option == "--header"):
            line += (
                f"; send arbitrary bytes with {_BYTES_OPTION.get(option, '--header-file')} PATH"
                if option != "--header"
                else "; send arbitrary header bytes with --header-file NAME=PATH"
                " (header names are text)"
            )
        return line
    return None


def _is_loose_value(argument: str | None, command: click.Group) -> bool:
    """Whether ``argument`` (after ``-X name``) can be a stray value rather than an option
    or a command name, which must stay readable."""
    if argument is None or argument.startswith("-"):
        return False
    names = set(command.commands)
    for sub in command.commands.values():
        if isinstance(sub, click.Group):
            names.update(sub.commands)
    return argument not in names


def _split_setting(value: str) -> tuple[str, str, str]:
    """``name=value`` (or the mistyped ``name:value``) as ``(name, separator, value)``."""
    name, separator, setting = value.partition("=")
    if not separator:
        colon_name, colon, colon_setting = value.partition(":")
        if colon and _CLIENT_SETTING.fullmatch(colon_name):
            return colon_name, colon, colon_setting
    return name, separator, setting


def _option_values(argv: Sequence[str]) -> Iterator[tuple[str, str, str | None]]:
    """``(option, value, the argument after it)`` for ``-X``, ``-b`` and the URL options,
    written ``-X v``, ``-Xv``, ``--option v`` or ``--option=v``."""
    wanted = ("-X", "-b", "--bootstrap-servers", *_URL_OPTIONS)
    for index, argument in enumerate(argv):
        after = argv[index + 1] if index + 1 < len(argv) else None
        after_next = argv[index + 2] if index + 2 < len(argv) else None
        if argument in wanted and after is not None:
            yield argument, after, after_next
        elif argument.startswith("--") and argument.partition("=")[0] in wanted:
            yield argument.partition("=")[0], argument.partition("=")[2], after
        elif argument[:2] in ("-X", "-b") and len(argument) > 2:
            yield argument[:2], argument[2:], after


def _value_options(group: click.Group) -> set[str]:
    """Every option of ``group`` and its subcommands that takes a value."""
    found: set[str] = set()
    commands: list[click.Command] = [group]
    while commands:
        command = commands.pop()
        for param in command.params:
            if isinstance(param, click.Option) and not (param.is_flag or param.count):
                found.update(param.opts)
        if isinstance(command, click.Group):
            commands.extend(command.commands.values())
    return found


def _owner(argv: Sequence[str], index: int, value_options: set[str]) -> str:
    """The option ``argv[index]`` is (or carries) the value of; else where it stands."""
    argument = argv[index]
    if argument.startswith("--") and "=" in argument:
        return argument.partition("=")[0]
    if index > 0 and argv[index - 1] in value_options:
        return argv[index - 1]
    if argument[:2] in value_options and not argument.startswith("--"):
        return argument[:2]
    return f"argument {index + 1}"
