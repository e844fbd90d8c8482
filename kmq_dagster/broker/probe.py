"""Is a Kafka broker answering? One ApiVersions request over a plain socket; and is anything
listening at all?

The launcher must not import confluent-kafka (only ``kmq_dagster.kafka`` does), and a TCP
accept alone does not prove the broker serves the protocol yet. A refused TCP connection, on
the other hand, proves at once that no broker listens there: the Kafka clients would only retry
until their request timeout.
"""

from __future__ import annotations

import socket
import struct

_API_VERSIONS_KEY = 18
_CORRELATION_ID = 0x6B6D71  # "kmq"
_CLIENT_ID = b"kmq-probe"


def _api_versions_request() -> bytes:
    # Request header v1 (api key, api version, correlation id, client id); ApiVersions v0 body
    # is empty. The whole request is prefixed with its int32 size.
    header = struct.pack(">hhih", _API_VERSIONS_KEY, 0, _CORRELATION_ID, len(_CLIENT_ID))
    payload = header + _CLIENT_ID
    return struct.pack(">i", len(payload)) + payload


def kafka_answers(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True if ``host:port`` answers an ApiVersions request without error."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(_api_versions_request())
            head = _read_exactly(conn, 10)  # size, correlation id, error code
    except OSError:
        return False
    if head is None:
        return False
    _size, correlation_id, error_code = struct.unpack(">iih", head)
    return bool(correlation_id == _CORRELATION_ID and error_code == 0)


def connection_refused(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True if every address of ``host:port`` refuses a TCP connection (nothing listens there).

    An accepted connection, a timeout (a slow or firewalled host) or a name that does not
    resolve is not a refusal: those are left to the clients' own timeouts.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, kind, proto, _name, address in addresses:
        try:
            with socket.socket(family, kind, proto) as conn:
                conn.settimeout(timeout_s)
                conn.connect(address)
        except ConnectionRefusedError:
            continue
        except OSError:
            return False
        return False
    return bool(addresses)


def _read_exactly(conn: socket.socket, count: int) -> bytes | None:
    data = b""
    while len(data) < count:
        chunk = conn.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data
