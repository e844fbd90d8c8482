"""A narrow window for the port picker: collisions that are rare across its 15,000 ports
become likely, so a test sees whether ports promised to servers not yet listening are kept
apart."""

from __future__ import annotations

import pytest

from kmq_dagster.broker import ports
from kmq_dagster.broker.ports import port_is_free
from kmq_dagster.broker.seaweed import GRPC_PORT_OFFSET


def narrow_pick_range(monkeypatch: pytest.MonkeyPatch, size: int) -> list[int]:
    """Make the port picker choose among ``size`` ports only, each free right now with its
    SeaweedFS gRPC partner (+ ``GRPC_PORT_OFFSET``); skips the test if no such window is."""
    for low in range(20_000, 20_000 + 100 * size, size):
        window = list(range(low, low + size))
        if all(port_is_free(p) and port_is_free(p + GRPC_PORT_OFFSET) for p in window):
            monkeypatch.setattr(ports, "_PICK_RANGE", (low, low + size))
            return window
    pytest.skip("no free window of ports to pick from")
