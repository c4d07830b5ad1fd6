"""A TCP proxy in front of a real server (PostgreSQL, the S3 server, gunicorn) that fails the way
networks and overloaded servers do: live connections cut, new ones refused, the first request of
a new HTTP connection answered 503, a new connection held before it is forwarded."""

import contextlib
import socket
import threading
import time

SLOW_DOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
    b"Content-Length: 95\r\n\r\n"
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>\n\n"
)


class TcpFaultProxy:
    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.refusing = False  # new connections are closed at once
        self.refuse_http_method: bytes | None = None  # b"PUT": such requests answered 503
        self.hold_next: list[float] = []  # seconds to hold each of the next new connections
        self.refused = 0
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Close every live connection, both ways, as a network partition or a restart does."""
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self.lock:
            hold = self.hold_next.pop(0) if self.hold_next else 0
        if hold:
            time.sleep(hold)
        if self.refusing:
            self.refused += 1
            client.close()
            return
        first = b""
        if self.refuse_http_method:
            first = client.recv(65536)
            if first.startswith(self.refuse_http_method + b" "):
                self.refused += 1
                client.sendall(SLOW_DOWN)
                client.close()
                return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        except OSError:
            client.close()
            return
        if first:
            upstream.sendall(first)
        with self.lock:
            self.pairs.append((client, upstream))
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
        self._pipe(client, upstream)

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
