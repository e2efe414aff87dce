"""A small keep-alive HTTP/1.1 client on asyncio streams, for the payment handler's one POST.

Why not httpx here: on this project's 2-core machine an httpx.AsyncClient spent several
milliseconds of CPU per request at 64 in flight (its pool scans every connection for every
request), which capped the handler at a few hundred calls per second; this client does one
write and one parse per call. It does exactly what the handler needs: POST a small JSON body,
read the status (skipping 1xx informational responses), drain the body (Content-Length,
chunked, or until close), keep the connection for the next call. A response cut short is a
transport error, never a verdict. No redirects, no cookies, no proxies. http and https.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections import deque
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from batch_assets import ConfigError

_MAX_HEAD = 64 * 1024


class HttpError(Exception):
    """A transport failure: `kind` is connection_error, timeout or transport_error (never the URL)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


@dataclass(frozen=True)
class Answer:
    """The final response: its status and its `Retry-After` header as sent (None when absent)."""

    status: int
    retry_after: str | None = None


class _Stale(Exception):
    """A kept-alive connection the server had closed: the request never reached it."""


class PostClient:
    """POSTs to one URL over at most `max_connections` kept-alive connections."""

    def __init__(self, url: str, *, timeout_s: float, max_connections: int) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("must be an http(s) URL", field="BATCH_ASSETS_LIMITS_URL")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.timeout_s = timeout_s
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = parts.netloc.rsplit("@", 1)[-1]
        head = f"POST {target} HTTP/1.1\r\nHost: {host_header}\r\nContent-Type: application/json\r\n"
        if parts.username is not None:
            token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            head += f"Authorization: Basic {base64.b64encode(token).decode()}\r\n"
        self._head = head.encode("latin-1")
        self._idle: deque[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = deque()
        self._slots = asyncio.Semaphore(max(int(max_connections), 1))

    async def post(self, body: bytes, headers: dict[str, str]) -> int:
        """POST `body`; return the status code. Raises HttpError on timeouts and transport failures."""
        return (await self.post_answer(body, headers)).status

    async def post_answer(self, body: bytes, headers: dict[str, str]) -> Answer:
        """POST `body`; return the status and the final response's Retry-After (raw text, or None)."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = self._head + f"{extra}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body
        async with self._slots:
            try:
                async with asyncio.timeout(self.timeout_s):
                    while self._idle:
                        conn = self._idle.pop()
                        try:
                            return await self._exchange(conn, request, reused=True)
                        except _Stale:
                            continue  # the server closed it while idle; the request never got there
                    conn = await self._connect()
                    return await self._exchange(conn, request, reused=False)
            except TimeoutError:
                raise HttpError("timeout", "limits call timed out") from None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=_MAX_HEAD)
        except OSError as exc:
            raise HttpError("connection_error", f"cannot connect to limits service ({type(exc).__name__})") from None

    async def _exchange(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes, *, reused: bool
    ) -> Answer:
        reader, writer = conn
        keep = False
        try:
            try:
                writer.write(request)
                await writer.drain()
                status_line = await reader.readline()
            except (ConnectionError, OSError) as exc:
                if reused:
                    raise _Stale from None
                raise HttpError("transport_error", f"limits call failed ({type(exc).__name__})") from None
            if not status_line:
                if reused:
                    raise _Stale
                raise HttpError("transport_error", "limits service closed the connection")
            answer, keep = await self._read_response(reader, status_line)
            return answer
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError, OSError) as exc:
            raise HttpError("transport_error", f"limits call failed ({type(exc).__name__})") from None
        finally:
            if keep:
                self._idle.append(conn)
            else:
                writer.close()

    async def _read_response(self, reader: asyncio.StreamReader, status_line: bytes) -> tuple[Answer, bool]:
        """The final response (status, Retry-After) and whether the connection may be kept; its body is drained.

        1xx informational responses (100 Continue, 103 Early Hints) come before the final one and
        are skipped, so the final verdict is never left unread for the next call on this connection.
        A response cut short anywhere (status line, headers, body) raises: a transport failure, never
        a verdict.
        """
        while True:
            status, keep, length, chunked, retry_after = await self._read_head(reader, status_line)
            if status == 101:
                raise ValueError("unexpected 101 Switching Protocols")
            if not 100 <= status < 200:
                break
            status_line = await reader.readline()
            _complete(status_line)
        answer = Answer(status, retry_after)
        if status in (204, 304):
            return answer, keep
        if chunked:
            while True:
                size_line = await reader.readline()
                _complete(size_line)
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while _complete(await reader.readline()) not in (b"\r\n", b"\n"):
                        pass  # trailers
                    return answer, keep
                await reader.readexactly(size + 2)
        if length is not None:
            await reader.readexactly(length)
            return answer, keep
        await reader.read()  # no length: the body ends when the server closes
        return answer, False

    async def _read_head(
        self, reader: asyncio.StreamReader, status_line: bytes
    ) -> tuple[int, bool, int | None, bool, str | None]:
        """Status line and headers: (status, keep-alive, Content-Length or None, chunked, Retry-After or None)."""
        parts = _complete(status_line).split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
            raise ValueError("not an HTTP/1.x status line")
        status = int(parts[1])
        keep = parts[0] == b"HTTP/1.1"
        length: int | None = None
        chunked = False
        retry_after: str | None = None
        while True:
            line = _complete(await reader.readline())
            if line in (b"\r\n", b"\n"):
                return status, keep, length, chunked, retry_after
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"retry-after":
                retry_after = value.strip()[:64].decode("latin-1")
            value = value.strip().lower()
            if name == b"content-length":
                if not value.isdigit() or (length is not None and length != int(value)):
                    raise ValueError("bad Content-Length")
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value
            elif name == b"connection":
                keep = value != b"close" if keep else value == b"keep-alive"

    async def aclose(self) -> None:
        while self._idle:
            _, writer = self._idle.pop()
            writer.close()


def _complete(line: bytes) -> bytes:
    """`line` as read by readline; one without its line end means the server closed mid-response."""
    if not line.endswith(b"\n"):
        raise asyncio.IncompleteReadError(line, None)
    return line
