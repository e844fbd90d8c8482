"""Exports that only a logged-in session can download, and only once.

Streamlit serves every download at ``/media/<hash>.<ext>`` to whoever asks, with no session
or cookie check, for as long as the file is kept. So an export here is never placed there in
advance: the button carries a callable, which Streamlit runs only when the session that drew
the button asks for it over its own websocket, and which refuses to make the file unless that
session is still logged in (not logged out, not idle past its limit, its user still in the
users file). The file it makes is then served under a random name of its own
(:class:`DownloadAliases`, never the content hash Streamlit would use, which is the same for
the same export), for a moment only: the first request for it (the browser's download;
Chromium may ask twice for one download) ends it :data:`SERVED_FOR_S` seconds later, so its
URL is worthless to anyone who reads it afterwards, logged in or not.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import threading
from collections.abc import Callable
from typing import Any

import streamlit as st
from streamlit.runtime import Runtime
from streamlit.runtime.media_file_storage import MediaFileKind, MediaFileStorageError

from kmq_dagster.errors import PermissionDeniedError

#: How long a download's URL serves after the first request for it, in seconds.
SERVED_FOR_S = 3.0
#: How long a download's URL serves if it is never requested, in seconds.
UNCLAIMED_FOR_S = 60.0

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
    aliases = DownloadAliases(storage)
    storage.get_url = aliases.get_url
    storage.get_file = aliases.get_file


class DownloadAliases:
    """Serve each download under a random name of its own, for a short time.

    Streamlit names a file by a hash of its content, so the same export has the same URL every
    time, and anyone who once saw it (a proxy log, a shared screen) could fetch the next one
    while it is served. Here every URL handed out for a download is a fresh random alias
    (128 bits); the content-hash name serves nothing. An alias lives :data:`SERVED_FOR_S`
    seconds after its first request, or :data:`UNCLAIMED_FOR_S` seconds if never requested;
    the file goes with its last alias. Other media (images) are served as Streamlit serves them.
    """

    def __init__(self, storage: Any) -> None:
        self._get_file = storage.get_file
        self._get_url = storage.get_url
        self._delete_file = storage.delete_file
        self._file_of_alias: dict[str, str] = {}
        self._claimed: set[str] = set()
        self._lock = threading.Lock()

    def get_url(self, file_id: str) -> str:
        _looking_up_url.active = True  # Streamlit's get_url reads the file through get_file
        try:
            url = str(self._get_url(file_id))
            found = self._get_file(file_id)
        finally:
            _looking_up_url.active = False
        if found.kind != MediaFileKind.DOWNLOADABLE:
            return url
        alias = secrets.token_hex(16)
        with self._lock:
            self._file_of_alias[alias] = file_id
        self._forget_later(alias, UNCLAIMED_FOR_S)
        head, _, tail = url.rpartition(file_id)
        return f"{head}{alias}{tail}"

    def get_file(self, filename: str) -> Any:
        if getattr(_looking_up_url, "active", False):
            return self._get_file(filename)
        name, extension = os.path.splitext(filename)
        with self._lock:
            file_id = self._file_of_alias.get(name)
            first_request = file_id is not None and name not in self._claimed
            if first_request:
                self._claimed.add(name)
        if file_id is not None:
            if first_request:
                self._forget_later(name, SERVED_FOR_S)
            return self._get_file(f"{file_id}{extension}")
        found = self._get_file(filename)
        if found.kind == MediaFileKind.DOWNLOADABLE:
            raise MediaFileStorageError(f"no media file {filename!r}")
        return found

    def _forget_later(self, alias: str, after_s: float) -> None:
        timer = threading.Timer(after_s, self._forget, args=(alias,))
        timer.daemon = True
        timer.start()

    def _forget(self, alias: str) -> None:
        with self._lock:
            file_id = self._file_of_alias.pop(alias, None)
            self._claimed.discard(alias)
            still_named = file_id in self._file_of_alias.values()
        if file_id is not None and not still_named:
            self._delete_file(file_id)
