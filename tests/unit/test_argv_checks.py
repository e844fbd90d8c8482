"""The raw command line: secrets registered before click can echo them, and arguments that
are not UTF-8 refused with the option they belong to."""

from __future__ import annotations

import pytest

from kmq_dagster.cli import cli
from kmq_dagster.cli.argv_checks import first_undecodable_argument, register_argv_secrets
from kmq_dagster.secrets import mask_text


@pytest.mark.parametrize(
    "argv",
    [
        ["provision", "-X", "sasl.password:Planted-1"],
        ["provision", "-X", "=Planted-1"],
        ["-XSASL.PASSWORD=Planted-1", "provision"],
        ["provision", "-X", "sasl.password", "Planted-1"],
        ["provision", "-b", "kmq:Planted-1@broker:9092"],
        ["provision", "--bootstrap-servers=a:1,kmq:Planted-1@b:2"],
        ["console", "--audit-url", "postgresql://kmq:Planted-1@db/kmq"],
    ],
)
def test_secrets_typed_in_any_form_are_masked_from_then_on(argv: list[str]) -> None:
    register_argv_secrets(argv, cli)

    assert mask_text("error: got Planted-1") == "error: got ***"


def test_a_command_name_after_a_secret_setting_stays_readable() -> None:
    register_argv_secrets(["-X", "sasl.password", "provision", "-t", "t"], cli)

    assert mask_text("kmq provision") == "kmq provision"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["send", "-t", "t", "--value", "\udcff"], "--value: the argument is not UTF-8 text "
         "(byte 0xff); send arbitrary bytes with --value-file PATH"),
        (["send", "-t", "t", "-k", "a\udcfeb"], "-k: the argument is not UTF-8 text (byte 0xfe); "
         "send arbitrary bytes with --key-file PATH"),
        (["send", "-t", "t", "--header=h=\udcff"], "--header: the argument is not UTF-8 text"),
        (["replay", "-t", "t", "-g", "g", "--key", "\udcff"], "--key: the argument is not "
         "UTF-8 text (byte 0xff)"),
        (["provision", "-t", "\udcff"], "-t: the argument is not UTF-8 text"),
        (["\udcff"], "argument 1: the argument is not UTF-8 text"),
    ],
)  # fmt: skip
def test_an_argument_that_is_not_utf8_names_its_option(argv: list[str], line: str) -> None:
    found = first_undecodable_argument(argv, cli)

    assert found is not None and found.startswith(line), found


def test_utf8_arguments_pass() -> None:
    assert first_undecodable_argument(["send", "-t", "t", "--value", "Zoë → 東京"], cli) is None
