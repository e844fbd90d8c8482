"""Exports that only a logged-in session can download, and only once.

Streamlit serves every download at ``/media/<hash>.<ext>`` to whoever asks, with no session
or cookie check, for as long as the file is kept. So an export here is never placed there in
advance: the button carries a callable, which Streamlit runs only when the session that drew
the button asks for it over its own websocket, and which refuses to make the file unless that
session is still logged in (not logged out, not idle past its limit, its user still in the
users file). The file it makes is then served for a moment only: the first request for it (the
browser's download; Chromium may ask twice for one download) removes it
:data:`SERVED_FOR_S` seconds later, so its URL is worthless to anyone who reads it afterwards,
logged in or not.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import streamlit as st
from streamlit.runtime import Runtime
from streamlit.runtime.media_file_storage import MediaFileKind

from kmq_dagster.errors import PermissionDeniedError

#: How long a downloadable file stays after the first request for it, in seconds.
SERVED_FOR_S = 3.0

_looking_up_url = threading.local()
_log = logging.getLogger(__name__)


def download_button(
    label: str,
    make_data: Callable[[], str | bytes],
    *,
    file_name: str,
    mime: str,
    key: str,
    allowed: Callable[[], bool],
) -> None:
    """A download button whose file is made on click, for a session ``allowed()`` accepts.

    Args:
        make_data: builds the file's content (runs outside the page script: no ``st`` calls).
        allowed: whether the session that drew the button may still download (checked on
            click, outside the page script: no ``st`` calls).
    """
    serve_downloads_once()

    def on_click() -> str | bytes:
        if not allowed():
            raise PermissionDeniedError("log in again to download")
        return make_data()

    st.download_button(label, on_click, file_name=file_name, mime=mime, key=key, on_click="ignore")


def serve_downloads_once() -> None:
    """Make every downloadable file of this console process servable once (idempotent)."""
    if Runtime.exists():
        _serve_once(Runtime.instance().media_file_mgr)


@functools.cache
def _serve_once(manager: Any) -> None:
    # Streamlit keeps its file store private; it is the one place every /media request reads.
    storage = getattr(manager, "_storage", None)
    if storage is None or not hasattr(storage, "get_file") or not hasattr(storage, "get_url"):
        # A Streamlit that stores files differently: files are still made only on click, but
        # live until Streamlit drops them (the browser test catches this on an upgrade).
        _log.warning("cannot serve console downloads once with this Streamlit version")
        return
    get_file, get_url = storage.get_file, storage.get_url
    leaving: set[str] = set()

    def get_url_keeping(file_id: str) -> str:
        _looking_up_url.active = True
        try:
            return str(get_url(file_id))
        finally:
            _looking_up_url.active = False

    def get_file_once(filename: str) -> Any:
        found = get_file(filename)
        if found.kind == MediaFileKind.DOWNLOADABLE and not getattr(
            _looking_up_url, "active", False
        ):
            file_id = os.path.splitext(filename)[0]
            if file_id not in leaving:
                leaving.add(file_id)
                timer = threading.Timer(SERVED_FOR_S, remove, args=(file_id,))
                timer.daemon = True
                timer.start()
        return found

    def remove(file_id: str) -> None:
        storage.delete_file(file_id)
        leaving.discard(file_id)

    storage.get_url = get_url_keeping
    storage.get_file = get_file_once
