"""``async def`` handlers run on uvloop where it is installed; ``KMQ_EVENT_LOOP`` chooses."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
import uvloop

from kmq_dagster.errors import ConfigError
from kmq_dagster.worker.event_loops import EVENT_LOOP_ENV, new_event_loop
from kmq_dagster.worker.handler_call import HandlerCall
from kmq_dagster.worker.handler_runner import EventLoopRunner
from tests.unit.fakes import message


def loop_of_a_call(monkeypatch: pytest.MonkeyPatch, choice: str | None) -> type:
    """The class of the event loop an ``async def`` handler's call runs on."""
    if choice is None:
        monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    else:
        monkeypatch.setenv(EVENT_LOOP_ENV, choice)
    seen: list[type] = []

    async def handle(_msg: object) -> None:
        seen.append(type(asyncio.get_running_loop()))

    runner = EventLoopRunner(HandlerCall(handle))
    try:
        runner.submit(message("orders", 0))
        began = time.monotonic()
        while not runner.take_ends(0.05):
            assert time.monotonic() - began < 60, "the call never ended"
    finally:
        runner.close()
    return seen[0]


@pytest.mark.parametrize("choice", [None, "auto", "uvloop", " UVLoop "])
def test_an_async_handler_runs_on_uvloop_by_default_and_when_asked(
    monkeypatch: pytest.MonkeyPatch, choice: str | None
) -> None:
    assert issubclass(loop_of_a_call(monkeypatch, choice), uvloop.Loop)


def test_kmq_event_loop_asyncio_runs_it_on_the_standard_librarys_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop_class = loop_of_a_call(monkeypatch, "asyncio")
    assert not issubclass(loop_class, uvloop.Loop)
    assert issubclass(loop_class, asyncio.BaseEventLoop)


def test_without_uvloop_auto_falls_back_to_asyncio_and_uvloop_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError

    monkeypatch.setenv(EVENT_LOOP_ENV, "auto")
    loop = new_event_loop()
    try:
        assert not isinstance(loop, uvloop.Loop)
    finally:
        loop.close()

    monkeypatch.setenv(EVENT_LOOP_ENV, "uvloop")
    with pytest.raises(ConfigError, match="KMQ_EVENT_LOOP=uvloop, but uvloop is not installed"):
        new_event_loop()


def test_an_unknown_event_loop_is_a_config_error_naming_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    with pytest.raises(ConfigError, match="KMQ_EVENT_LOOP must be one of auto, uvloop, asyncio"):
        new_event_loop()


def test_a_bad_event_loop_fails_where_the_handler_is_taken_not_at_its_first_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a sync handler may return an awaitable: its loop is made only then
    monkeypatch.setenv(EVENT_LOOP_ENV, "uv-loop")
    with pytest.raises(ConfigError, match="got 'uv-loop'"):
        HandlerCall(lambda _msg: None)
