"""The one place secrets are masked: URLs, client settings, and any text or log line.

Every password, token or key kmq is given (a client setting such as ``sasl.password``, the
password of the audit store's URL, in its user part or its query) is registered here when the
setting is read; from then on :func:`mask_text` and every log record of the process show
``***`` in its place. Front ends mask their error lines with :func:`mask_text` too.

Examples:
    >>> mask_url("postgresql+psycopg://kmq:hunter2@db:5432/kmq?sslpassword=s3cret&sslmode=require")
    'postgresql+psycopg://kmq:***@db:5432/kmq?sslpassword=***&sslmode=require'
    >>> mask_config({"sasl.username": "kmq", "sasl.password": "hunter2"})
    {'sasl.username': 'kmq', 'sasl.password': '***'}
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

MASK = "***"
#: Setting and query-parameter names whose values are secrets (matched anywhere in the name).
_SECRET_NAME = re.compile(
    r"password|passwd|secret|token|credential|jaas|api[._-]?key|private[._-]?key|key\.pem"
    r"|keystore\.key",
    re.IGNORECASE,
)
#: Shorter values are not registered: masking every "a" or "12" would garble logs.
_MIN_REGISTERED_LENGTH = 4

_registered: set[str] = set()
_lock = threading.Lock()
#: Whether log records are masked yet (installed with the first secret).
_log_masking = {"installed": False}


def is_secret_name(name: str) -> bool:
    """Whether a setting or URL parameter called ``name`` holds a secret."""
    return bool(_SECRET_NAME.search(name))


def mask_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of client settings with secret values masked."""
    return {key: MASK if is_secret_name(key) else value for key, value in config.items()}


def mask_url(url: str) -> str:
    """``url`` with the password of its user part and every secret query value masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return mask_text(url)
    if not parts.scheme:
        return mask_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}{colon}{MASK if colon else ''}@{host}"
    query = "&".join(
        f"{quote(name, safe='')}={MASK if is_secret_name(name) else quote(value, safe='')}"
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return mask_text(f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else ""))


def url_secrets(url: str) -> list[str]:
    """The secret values in ``url``: its password and secret query values (decoded)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return []
    found = [unquote(password)] if password else []
    found += [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if is_secret_name(k)]
    return found


def register_secret(value: str | None) -> None:
    """Mask ``value`` in :func:`mask_text` and in every log record from now on."""
    if value is None or len(value) < _MIN_REGISTERED_LENGTH:
        return
    with _lock:
        _registered.add(value)
        if quote(value, safe="") != value:
            _registered.add(quote(value, safe=""))
    _install_log_masking()


def register_config_secrets(config: Mapping[str, Any]) -> None:
    """Register the secret values among client settings."""
    for key, value in config.items():
        if is_secret_name(key) and value is not None:
            register_secret(str(value))


def register_url_secrets(url: str) -> None:
    """Register the password and the secret query values of ``url``."""
    for secret in url_secrets(url):
        register_secret(secret)


def mask_text(text: str) -> str:
    """``text`` with every registered secret replaced by ``***``."""
    with _lock:
        secrets = sorted(_registered, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def _install_log_masking() -> None:
    """Mask registered secrets in every log record the process creates, whoever handles it
    (kmq's own handlers, Dagster's run log, a user's)."""
    with _lock:
        if _log_masking["installed"]:
            return
        _log_masking["installed"] = True
        previous = logging.getLogRecordFactory()

    def masked_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed log call is reported by logging itself
            return record
        masked = mask_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        return record

    logging.setLogRecordFactory(masked_record)
