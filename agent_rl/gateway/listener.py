"""The gateway's listening socket, accepted by hand so that no connection outlives `Gateway.close()`.

    listener = Listener(runner.server)          # aiohttp's protocol factory (web.AppRunner after setup())
    port = listener.start(host, port)           # bound and accepting
    await listener.close()                      # not accepting; every connection it accepted is attached,
    await runner.cleanup()                      # so aiohttp's graceful shutdown answers or closes every one

Why not aiohttp's TCPSite (`loop.create_server`): CPython's asyncio.Server has a race between accepting and
`close()` (gh-109564, open for 3.11-3.13). A connection accepted in the loop step before `Server.close()` is
handed to a task that, one step later, asserts the server still has its sockets (`Server._attach`), fails, and
swallows the failure (logged only in asyncio's debug mode): the accepted socket is never closed and never
read, and lives until the cyclic garbage collector frees it. A client whose request landed there waits for an
answer that never comes: the external agent of tests/gateway/test_external.py hung on its
`POST /sessions/{id}/close`, sent the instant the run's shutdown failed its last chat call, just as the gateway
closed (tests/gateway/test_external_shutdown.py reproduces the step). Here the accept is ours: each accepted
socket is attached with `loop.connect_accepted_socket` (no Server, so no `_attach`), and `close()` first stops
accepting, then waits for the sockets already accepted to be attached, so aiohttp's shutdown sees every one (an
attach cancelled by the run's loop closing closes its socket: connect_accepted_socket's own failure path).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)

# out of file descriptors: accept again after this long (asyncio's own listener does the same)
RETRY_ACCEPT_S = 1.0


class Listener:
    def __init__(self, protocol_factory: Callable[[], asyncio.BaseProtocol]):
        self._factory = protocol_factory
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._attaching: set[asyncio.Task] = set()  # accepted sockets on their way to a transport
        self._closed = False

    def start(self, host: str, port: int, backlog: int = 128) -> int:
        """Bind `host:port` (0: any free port) and accept on the running loop; the port bound. A host name binds
        the first address it resolves to (clients connecting by that name try each of its addresses in turn)."""
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's create_server on POSIX
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock, self._loop = sock, asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._accept)
        return sock.getsockname()[1]

    def _accept(self) -> None:
        """The listening socket is readable: take every connection waiting (asyncio's own loop does this)."""
        assert self._sock is not None and self._loop is not None
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as e:  # EMFILE and friends: the socket stays readable, so stop watching it a while
                log.warning("gateway: accept failed (%s); accepting again in %g s", e, RETRY_ACCEPT_S)
                self._loop.remove_reader(self._sock.fileno())
                self._loop.call_later(RETRY_ACCEPT_S, self._resume)
                return
            conn.setblocking(False)
            task = self._loop.create_task(self._attach(conn))
            self._attaching.add(task)
            task.add_done_callback(self._attaching.discard)

    def _resume(self) -> None:
        if not self._closed and self._sock is not None and self._loop is not None:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    async def _attach(self, conn: socket.socket) -> None:
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except BaseException:
            conn.close()
            raise

    async def close(self) -> None:
        """Stop accepting (a connection not yet accepted is refused) and wait until every connection accepted
        so far has its transport and protocol, so that the server's shutdown reaches it."""
        if self._closed:
            return
        self._closed = True
        if self._sock is not None and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        await asyncio.gather(*self._attaching, return_exceptions=True)
