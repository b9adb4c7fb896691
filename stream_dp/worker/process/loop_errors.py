"""What the worker's event loop reports of errors nobody awaited.

asyncio logs "Future exception was never retrieved", with a traceback, when a
future that failed is garbage-collected unread. A Kafka client's socket reset
by its broker (a broker stopped, restarted or cut off) leaves such a future
behind: the stream protocol's closed-future holds the ``ConnectionResetError``
the client already handled (it closed the connection, failed the requests on
it and reconnects), and when protocol and future are collected together, in
one reference cycle, the future can go first, unread. The traceback then reads
like a crash in the middle of an outage the worker rides through.

``quiet_connection_errors`` logs that case as one warning line and leaves every
other report -- any other exception, any other message -- to asyncio's own
handler, traceback and all.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

_UNRETRIEVED = "exception was never retrieved"


def is_unread_connection_error(context: dict[str, Any]) -> bool:
    """Whether a loop report is a failed future's connection error that nobody read (see the module docstring)."""
    exception = context.get("exception")
    return (_UNRETRIEVED in str(context.get("message", ""))
            and isinstance(exception, ConnectionError) and "future" in context)


def quiet_connection_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A loop exception handler (``loop.set_exception_handler``)."""
    if is_unread_connection_error(context):
        log.warning("a network connection was lost (%r); the client that owned it has handled it",
                    context["exception"])
        return
    loop.default_exception_handler(context)
