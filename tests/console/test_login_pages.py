"""The login gate in ``AppTest``: no page without a principal, passwords from the users file,
``--no-auth`` on loopback only, OIDC when ``[auth]`` is configured, roles from the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit import config as streamlit_config
from streamlit.testing.v1 import AppTest

from kmq_dagster.console.auth import ADMIN, OPERATOR, UsersFile
from kmq_dagster.console.config import AUTH_ENV, NO_AUTH
from tests.console.apps import APP, texts
from tests.console.test_auth import PASSWORD, ROOT


def test_nothing_shows_before_login_and_a_wrong_password_is_refused(console_env: Path) -> None:
    UsersFile(console_env).add(ROOT, "olivia", OPERATOR, PASSWORD)
    app = AppTest.from_file(str(APP), default_timeout=30).run()

    assert [t.value for t in app.title] == ["kmq console"]
    assert "Overview" not in texts(app) and not app.dataframe
    app.text_input[0].input("olivia")
    app.text_input[1].input("wrong password!")
    app.button[0].click().run()
    assert "Wrong user name or password." in texts(app)
    assert [t.value for t in app.title] == ["kmq console"]

    app.text_input[1].input(PASSWORD)
    app.button[0].click().run()

    assert [t.value for t in app.title] == ["Overview"]
    assert "olivia\nrole: operator" in texts(app)
    app.button(key="logout").click().run()
    assert [t.value for t in app.title] == ["kmq console"]


def test_without_users_the_login_page_says_how_to_add_one(console_env: Path) -> None:
    app = AppTest.from_file(str(APP), default_timeout=30).run()

    assert "kmq console add-user NAME --role admin" in texts(app)


@pytest.mark.parametrize(("address", "opens"), [("127.0.0.1", True), ("0.0.0.0", False),
                                                 ("", False), ("::1", True)])  # fmt: skip
def test_no_auth_serves_loopback_only(
    console_env: Path, monkeypatch: pytest.MonkeyPatch, address: str, opens: bool
) -> None:
    monkeypatch.setenv(AUTH_ENV, NO_AUTH)
    streamlit_config.set_option("server.address", address)

    app = AppTest.from_file(str(APP), default_timeout=30).run()

    titles = [t.value for t in app.title]
    assert titles == (["Overview"] if opens else ["kmq console"])
    if opens:
        assert "(no auth)\nrole: admin" in texts(app)
        assert "Log out" not in [b.label for b in app.button]  # nothing to log out of
    else:
        assert "without authentication on a non-loopback address" in texts(app)


def test_with_oidc_configured_login_goes_to_the_provider_and_roles_come_from_the_file(
    console_env: Path,
) -> None:
    UsersFile(console_env).add(ROOT, "ada@example.com", ADMIN, None)
    provider = {
        "redirect_uri": "http://localhost:8501/oauth2callback",
        "cookie_secret": "s",
        "client_id": "c",
        "client_secret": "x",
        "server_metadata_url": "https://idp.example.com/.well-known/openid-configuration",
    }
    secrets = {"auth": provider}
    app = AppTest.from_file(str(APP), default_timeout=30)
    app.secrets.update(secrets)
    app.user = {"is_logged_in": False}
    app.run()

    assert [b.label for b in app.button] == ["Log in"]
    assert [t.value for t in app.title] == ["kmq console"]

    for email, role in [("ada@example.com", "admin"), ("bob@example.com", "viewer")]:
        app = AppTest.from_file(str(APP), default_timeout=30)
        app.secrets.update(secrets)
        app.user = {"is_logged_in": True, "email": email}
        app.run()
        assert [t.value for t in app.title] == ["Overview"]
        assert f"{email}\nrole: {role}" in texts(app)


def test_streamlit_run_ui_app_serves_the_same_console(
    console_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AUTH_ENV, NO_AUTH)

    app = AppTest.from_file(str(APP.parents[2] / "ui" / "app.py"), default_timeout=30).run()

    assert [t.value for t in app.title] == ["Overview"]
    assert not app.exception


def test_a_broken_users_file_or_setting_is_one_clear_error(
    console_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    console_env.write_text("{not json")
    broken_file = AppTest.from_file(str(APP), default_timeout=30).run()
    monkeypatch.setenv("KMQ_CONSOLE_REFRESH_S", "soon")
    broken_setting = AppTest.from_file(str(APP), default_timeout=30).run()

    assert "is not a kmq console users file" in texts(broken_file)
    assert "KMQ_CONSOLE_REFRESH_S must be a positive number" in texts(broken_setting)
    assert not broken_file.exception and not broken_setting.exception
