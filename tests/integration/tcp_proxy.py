"""A TCP proxy in front of PostgreSQL that fails connections on purpose: the network blips a
registry must ride out.

    with TcpProxy(5432) as proxy:           # listens on a free loopback port
        url = proxy.url(postgres_url)       # the same registry URL, through the proxy
        proxy.cut()                         # close every connection through it, both ends
        with proxy.cutting(every_s=0.7):    # ... again and again, in a thread
            ...
        proxy.cut_at(b"COMMIT", before=False)  # cut once the next COMMIT went through
        proxy.refuse(3.0)                   # refuse new connections (and cut the open ones)
                                            # for 3 s: nothing listens on its port meanwhile

A cut closes the client's socket (psycopg: "server closed the connection unexpectedly",
or "consuming input failed") and the server's (PostgreSQL rolls back what was in flight).
A refusal replaces the listening socket by one bound to the same port that does not listen,
so connecting is refused by the kernel ("Connection refused"), then listens again.
`accepted` counts the connections made through it, `cuts` the connections it closed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from sqlalchemy.engine import make_url


class TcpProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.accepted = 0
        self.cuts = 0
        self.refusing = False
        self._trap: tuple[bytes, bool] | None = None
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = threading.Event()
        self._listener: socket.socket | None = None
        self._listen()

    def url(self, registry_url: str) -> str:
        """*registry_url* (a PostgreSQL one) through this proxy."""
        return make_url(registry_url).set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False)

    def _bind(self) -> socket.socket:
        bound = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bound.bind(("127.0.0.1", self.port))
        self.port = bound.getsockname()[1]
        return bound

    def _listen(self, bound: socket.socket | None = None) -> None:
        listener = bound or self._bind()
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True,
                         name="tcp-proxy-accept").start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: refusing, or the proxy closed
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
                self.accepted += 1
            for source, sink, upward in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(source, sink, upward), daemon=True,
                                 name="tcp-proxy-pump").start()

    def _pump(self, source: socket.socket, sink: socket.socket, upward: bool) -> None:
        try:
            while data := source.recv(65536):
                trap = self._trap if upward else None
                if trap is not None and trap[0] in data:
                    self._trap = None
                    if not trap[1]:
                        sink.sendall(data)
                    self.cut()
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept
            listener.close()

    def cut(self) -> int:
        """Close every connection through the proxy (both ends); how many were open."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for end in pair:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()
        self.cuts += len(pairs)
        return len(pairs)

    def cut_at(self, marker: bytes, *, before: bool) -> None:
        """Cut every connection when a client next sends bytes holding *marker* (once):
        *before* they reach the server, or right after (its answer never comes back)."""
        self._trap = (marker, before)

    @contextlib.contextmanager
    def cutting(self, *, every_s: float) -> Iterator[None]:
        """Cut every connection each *every_s* seconds while the block runs."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every_s):
                self.cut()

        thread = threading.Thread(target=loop, daemon=True, name="tcp-proxy-cutter")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def refuse(self, seconds: float) -> None:
        """Cut every connection and refuse new ones for *seconds*: the port stays bound
        (no other process takes it meanwhile) by a socket that does not listen, so the
        kernel answers a connect with a reset ("Connection refused")."""
        self._stop_listening()
        placeholder = self._bind()
        self.cut()
        self.refusing = True
        time.sleep(seconds)
        self.refusing = False
        if self._closed.is_set():
            placeholder.close()
        else:
            self._listen(placeholder)

    def close(self) -> None:
        self._closed.set()
        self._stop_listening()
        self.cut()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
