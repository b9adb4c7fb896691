"""The worker's loop exception handler: an unread connection error is one warning line; anything else
is asyncio's own report, traceback and all. Real futures, left unread and collected, as in the worker."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from stream_dp.worker.process.loop_errors import quiet_connection_errors


def _leave_unread(exception: BaseException) -> None:
    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(quiet_connection_errors)
        future = asyncio.get_running_loop().create_future()
        future.set_exception(exception)
        del future
        gc.collect()  # the future's finaliser reports it to the loop's handler

    asyncio.run(main())


def _raised(exception: BaseException) -> BaseException:
    try:
        raise exception  # with a traceback, as a socket's error has
    except BaseException as caught:
        return caught


def test_an_unread_connection_reset_is_one_warning_without_a_traceback(caplog):
    with caplog.at_level(logging.WARNING):
        _leave_unread(_raised(ConnectionResetError(104, "Connection reset by peer")))
    records = [r for r in caplog.records if r.name in ("asyncio", "stream_dp.worker.process.loop_errors")]
    assert [(r.name, r.levelname) for r in records] == [("stream_dp.worker.process.loop_errors", "WARNING")]
    assert records[0].exc_info is None and "Connection reset by peer" in records[0].getMessage()


@pytest.mark.parametrize("exception", [ValueError("a bug"), TimeoutError("not a connection error")])
def test_any_other_unread_error_keeps_asyncios_report_and_traceback(caplog, exception):
    with caplog.at_level(logging.WARNING):
        _leave_unread(_raised(exception))
    records = [r for r in caplog.records if r.name in ("asyncio", "stream_dp.worker.process.loop_errors")]
    assert [(r.name, r.levelname) for r in records] == [("asyncio", "ERROR")]
    assert "never retrieved" in records[0].getMessage() and records[0].exc_info is not None
