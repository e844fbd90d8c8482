"""Real local servers that receive alerts: an HTTP server (webhook and Slack's Web API shape)
and an SMTP server (aiosmtpd), on free loopback ports."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller

from kmq_dagster.broker.ports import free_port


class HttpReceiver:
    """Records each POST (path, JSON or form body); answers ``fail_first`` requests with 503."""

    def __init__(self, fail_first: int = 0, status: int = 200) -> None:
        self.received: list[tuple[str, Any]] = []
        self.attempts = 0
        self.fail_first = fail_first
        self.status = status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.attempts += 1
                if receiver.attempts <= receiver.fail_first:
                    self.send_response(503)
                    self.end_headers()
                    return
                try:
                    parsed: Any = json.loads(body)
                except ValueError:
                    parsed = body.decode()
                receiver.received.append((self.path, parsed))
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"ok": true, "channel": "C1", "ts": "1.0"}')

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def bodies(self) -> list[Any]:
        return [body for _path, body in self.received]


@contextmanager
def http_receiver(fail_first: int = 0, status: int = 200) -> Iterator[HttpReceiver]:
    receiver = HttpReceiver(fail_first, status)
    receiver.thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"


@contextmanager
def smtp_receiver() -> Iterator[tuple[int, list[Message]]]:
    """A real SMTP server on a free port; yields (port, received messages)."""
    inbox = _Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, inbox.messages
    finally:
        controller.stop()
