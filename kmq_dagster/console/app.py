"""The console's entry script: ``kmq console`` runs it with Streamlit, ``ui/app.py`` calls
:func:`main`. Pages live in ``views/`` (not ``pages/``: Streamlit would serve a ``pages/``
folder on its own, around the login gate)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from kmq_dagster.console import login, session
from kmq_dagster.console.rendering import escape_markdown
from kmq_dagster.console.session import PRINCIPAL_KEY, config
from kmq_dagster.errors import KmqError

VIEWS = Path(__file__).resolve().parent / "views"


def main() -> None:
    st.set_page_config(page_title="kmq console", page_icon=":material/inbox:", layout="wide")
    try:
        settings = config()
        principal = login.logged_in(settings)
    except KmqError as exc:  # a bad KMQ_CONSOLE_* setting or users file: say which
        st.error(escape_markdown(str(exc)))
        return
    if principal is None:
        st.session_state.pop(PRINCIPAL_KEY, None)
        st.navigation([st.Page(login.login_page, title="Log in")], position="hidden").run()
        return
    st.session_state[PRINCIPAL_KEY] = principal
    session.touch()
    pages = st.navigation(
        [
            st.Page(VIEWS / "overview.py", title="Overview", icon=":material/monitoring:",
                    default=True),
            st.Page(VIEWS / "dead_letters.py", title="Dead letters", icon=":material/mail:"),
            st.Page(VIEWS / "actions.py", title="Actions", icon=":material/history:"),
            st.Page(VIEWS / "breakers.py", title="Breakers & alerts",
                    icon=":material/electrical_services:"),
        ]
    )  # fmt: skip
    with st.sidebar:
        st.text(f"{principal.name}\nrole: {principal.role}")
        # Without authentication there is no session to leave: the next page is the same admin.
        if not settings.no_auth and st.button("Log out", key="logout"):
            login.log_out(settings)
            st.rerun()
    pages.run()


if __name__ == "__main__":
    main()
