"""The worker's HTTP endpoint survives clients that drop their connection.

A scraper or probe that times out on a busy worker resets its connection, sometimes before the
server thread read the request. socketserver's default answer is a traceback on stderr, which is
the worker's log; an operator grepping for tracebacks then chases a client's timeout.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
import urllib.request

from stream_dp.metrics.http import serve_app


def _slow_app(environ, start_response):
    time.sleep(0.3)  # the reset below lands while the server is busy, as on a starved worker
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\n"]


def _reset(port: int, *, send_request: bool) -> None:
    client = socket.create_connection(("127.0.0.1", port))
    if send_request:
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: worker\r\n\r\n")
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
    client.close()


def test_a_client_resetting_its_connection_prints_no_traceback_and_the_server_goes_on(capfd, caplog):
    server, _thread = serve_app(0, "127.0.0.1", _slow_app)
    port = server.server_address[1]
    try:
        with caplog.at_level(logging.DEBUG, logger="stream_dp.metrics.http"):
            _reset(port, send_request=True)
            _reset(port, send_request=False)
            time.sleep(1.0)  # both handler threads have met the reset
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                assert response.read() == b"ok\n"
    finally:
        server.shutdown()
        server.server_close()
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err + printed.out
    assert not [r for r in caplog.records if r.exc_info], "a dropped client is not an error with a traceback"
    assert any("closed the connection" in r.getMessage() for r in caplog.records)


def test_any_other_failure_of_a_request_is_logged_with_its_traceback(caplog):
    server, _thread = serve_app(0, "127.0.0.1", _slow_app)
    try:
        with caplog.at_level(logging.ERROR, logger="stream_dp.metrics.http"):
            try:
                raise RuntimeError("handler bug")
            except RuntimeError:
                server.handle_error(None, ("127.0.0.1", 4321))  # what socketserver calls from the except
    finally:
        server.shutdown()
        server.server_close()
    (record,) = caplog.records
    assert "127.0.0.1" in record.getMessage() and record.exc_info[0] is RuntimeError
