"""A loopback TCP proxy that puts a distance between a client and a server: every byte arrives
half a round trip late in each direction, so each request costs one round trip more. Bandwidth is
not limited, so what the delay costs a tool is its requests made one after another. A new
connection costs no handshake: moto answers `Connection: close`, so every tool opens one per
request, where real S3 keeps them open.

    python -m bench.rtt_proxy --target http://127.0.0.1:PORT --rtt-ms 20 [--port N]

Prints the proxy's URL once it listens. The benchmarks start it with `proxied()`.
"""

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

from bench.common import free_port

CHUNK = 256 * 1024
IN_FLIGHT_CHUNKS = 64  # per direction of a connection: 16 MiB on its way, then the reader waits


async def _pump(reader, writer, delay: float) -> None:
    """Relay bytes, each chunk written `delay` seconds after it was read, in order."""
    queue: asyncio.Queue = asyncio.Queue(IN_FLIGHT_CHUNKS)

    async def deliver() -> None:
        while (item := await queue.get()) is not None:
            due, data = item
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    sending = asyncio.ensure_future(deliver())
    try:
        while data := await reader.read(CHUNK):
            await queue.put((time.monotonic() + delay, data))
    except ConnectionError:
        pass
    finally:
        await queue.put(None)
        with contextlib.suppress(ConnectionError):
            await sending


async def _serve(port: int, host: str, target_port: int, rtt: float) -> None:
    async def connection(client_reader, client_writer) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(host, target_port)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(
                _pump(client_reader, server_writer, rtt / 2),
                _pump(server_reader, client_writer, rtt / 2),
            )
        finally:
            for writer in (server_writer, client_writer):
                writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", port, backlog=1024)
    print(f"http://127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def proxied(target_url: str, rtt_ms: float):
    """`target_url` as seen from `rtt_ms` away: the proxy's URL (the target itself at 0 ms)."""
    if not rtt_ms:
        yield target_url
        return
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.rtt_proxy",
            "--target",
            target_url,
            "--rtt-ms",
            str(rtt_ms),
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # connections cut when it is stopped
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # listening (the target itself may not be up yet)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit("the round-trip proxy did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True, help="http://host:port")
    parser.add_argument("--rtt-ms", type=float, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    target = urlsplit(args.target)
    port = args.port or free_port()
    asyncio.run(_serve(port, target.hostname, target.port, args.rtt_ms / 1000))


if __name__ == "__main__":
    main()
