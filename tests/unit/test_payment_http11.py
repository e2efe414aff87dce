"""The payment handler's HTTP/1.1 client against a raw server: framing, keep-alive, stale connections, errors."""

from __future__ import annotations

import asyncio
import socket

import pytest

from batch_assets.errors import ConfigError
from batch_assets.reference.payments.http11 import HttpError, PostClient

pytestmark = pytest.mark.unit


async def _serve(responses: list[bytes], *, close_after: int | None = None) -> tuple[asyncio.Server, list[bytes]]:
    """A server that answers request i with responses[i] and records each request; closes after `close_after`."""
    seen: list[bytes] = []

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                seen.append(head + await reader.readexactly(length))
                writer.write(responses[len(seen) - 1])
                await writer.drain()
                served += 1
                if close_after is not None and served >= close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(client, "127.0.0.1", 0)
    return server, seen


def test_content_length_chunked_and_close_framed_answers() -> None:
    """Statuses come back through Content-Length, chunked and read-until-close bodies; the request is one POST."""

    async def scenario() -> None:
        server, seen = await _serve([
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nTrailer: t\r\n\r\n",
            b"HTTP/1.1 422 No\r\nConnection: close\r\n\r\nbody until close",
        ], close_after=3)
        port = server.sockets[0].getsockname()[1]
        client = PostClient(f"http://u:p%40ss@127.0.0.1:{port}/limits?x=1", timeout_s=5, max_connections=1)
        try:
            assert await client.post(b'{"a": 1}', {"Idempotency-Key": "k1"}) == 200
            assert await client.post(b'{"a": 2}', {"Idempotency-Key": "k2"}) == 503  # same connection
            assert await client.post(b'{"a": 3}', {"Idempotency-Key": "k3"}) == 422
        finally:
            await client.aclose()
            server.close()
        first = seen[0].decode()
        assert first.startswith("POST /limits?x=1 HTTP/1.1\r\n")
        assert "Idempotency-Key: k1\r\n" in first and "Content-Type: application/json\r\n" in first
        assert "Authorization: Basic dTpwQHNz\r\n" in first  # u:p@ss
        assert first.endswith('{"a": 1}')

    asyncio.run(scenario())


def test_a_connection_closed_while_idle_is_replaced_without_losing_the_call() -> None:
    """The server closes a kept-alive connection; the next call goes out on a fresh one and succeeds."""

    async def scenario() -> None:
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        server, seen = await _serve([ok, ok], close_after=1)
        port = server.sockets[0].getsockname()[1]
        client = PostClient(f"http://127.0.0.1:{port}/", timeout_s=5, max_connections=1)
        try:
            assert await client.post(b"{}", {}) == 200
            await asyncio.sleep(0.05)  # let the server's close reach the idle connection (not synchronisation)
            assert await client.post(b"{}", {}) == 200
        finally:
            await client.aclose()
            server.close()
        assert len(seen) == 2

    asyncio.run(scenario())


def test_refused_and_timed_out_calls_are_http_errors_without_the_url() -> None:
    """Connection refused → connection_error; no answer in time → timeout; neither message holds the URL."""

    async def scenario() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free = s.getsockname()[1]
        refused = PostClient(f"http://user:secret@127.0.0.1:{free}/x", timeout_s=5, max_connections=1)
        with pytest.raises(HttpError) as info:
            await refused.post(b"{}", {})
        assert info.value.kind == "connection_error" and "secret" not in str(info.value)

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.read()  # never answers
            finally:
                writer.close()  # when the loop ends (cancelled): else the accepted socket leaks

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        slow = PostClient(f"http://127.0.0.1:{port}/x", timeout_s=0.2, max_connections=1)
        with pytest.raises(HttpError) as info:
            await slow.post(b"{}", {})
        assert info.value.kind == "timeout"
        server.close()

    asyncio.run(scenario())
    with pytest.raises(ConfigError):
        PostClient("ftp://127.0.0.1/x", timeout_s=1, max_connections=1)


def test_1xx_informational_responses_are_skipped_so_each_call_reads_its_own_verdict() -> None:
    """103 Early Hints (and 100 Continue) before the final answer: the call returns the final status and the
    next call on the same kept-alive connection reads its own answer, not the previous one's."""

    async def scenario() -> None:
        server, seen = await _serve([
            b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n"
            b"HTTP/1.1 500 Broken\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 422 No\r\nContent-Length: 0\r\n\r\n",
        ])
        port = server.sockets[0].getsockname()[1]
        client = PostClient(f"http://127.0.0.1:{port}/", timeout_s=5, max_connections=1)
        try:
            statuses = [await client.post(b"{}", {"Idempotency-Key": f"k{i}"}) for i in range(3)]
        finally:
            await client.aclose()
            server.close()
        assert statuses == [200, 500, 422]
        assert len(seen) == 3

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "cut",
    [
        b"HTTP/1.1 200",  # status line cut
        b"HTTP/1.1 200 OK\r\nContent-Le",  # headers cut
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n",  # no blank line after the headers
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",  # body shorter than Content-Length
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",  # chunk cut
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",  # last chunk without its blank line
        b"HTTP/1.1 103 Early Hints\r\n\r\n",  # only the informational response
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n",  # never asked for
    ],
)
def test_a_response_cut_short_is_a_transport_error_never_a_verdict(cut: bytes) -> None:
    """The server closes mid-response: the call is a transport_error (retried later), never the cut status."""

    async def scenario() -> None:
        server, _ = await _serve([cut], close_after=1)
        port = server.sockets[0].getsockname()[1]
        client = PostClient(f"http://127.0.0.1:{port}/", timeout_s=5, max_connections=1)
        try:
            with pytest.raises(HttpError) as info:
                await client.post(b"{}", {})
        finally:
            await client.aclose()
            server.close()
        assert info.value.kind == "transport_error"

    asyncio.run(scenario())

