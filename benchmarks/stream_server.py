"""A cheap local OpenAI-style streaming server for the runner benchmark (raw asyncio, HTTP/1.1 keep-alive).

Each completion streams ``--chunks`` one-token SSE chunks (default 64; ``max_tokens`` in the body
overrides), the first after ``--ttft-ms``, the rest ``--gap-ms`` apart (0: back to back), then a usage
chunk and ``[DONE]`` (with no gap, all chunk events go out in one write). It logs every request's arrival time (CLOCK_MONOTONIC, the clock the clients
pace on) with its ``X-Request-Id``; ``GET /_arrivals`` returns the log and clears it. ``--core N``
pins the process to one CPU. Prints ``PORT <n>`` once listening.

    python benchmarks/stream_server.py --port 0 --core 1 --ttft-ms 5 --gap-ms 0
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

_CHUNK = b'data: {"id":"b","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"t"}}]}\n\n'
_TEXT_CHUNK = b'data: {"id":"b","object":"text_completion","choices":[{"index":0,"text":"t"}]}\n\n'


def _framed(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Server:
    def __init__(self, chunks: int, ttft_s: float, gap_s: float) -> None:
        self.chunks = chunks
        self.ttft_s = ttft_s
        self.gap_s = gap_s
        self.arrivals: list[tuple[float, str]] = []


class Conn(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.s = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            length = int(headers.get("content-length", "0"))
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4:head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            self.handle(method, path, headers, body)

    def _send(self, status: str, ctype: str, payload: bytes) -> None:
        if self.transport is not None:
            self.transport.write(b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                                 % (status.encode(), ctype.encode(), len(payload), payload))

    def handle(self, method: str, path: str, headers: dict, body: bytes) -> None:
        if method == "POST" and path.startswith("/v1/"):
            self.s.arrivals.append((time.perf_counter(), headers.get("x-request-id", "")))
            try:
                req = json.loads(body or b"{}")
            except ValueError:
                req = {}
            n = int(req.get("max_completion_tokens") or req.get("max_tokens") or self.s.chunks)
            chunk = _CHUNK if path.startswith("/v1/chat") else _TEXT_CHUNK
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n")
            asyncio.get_running_loop().create_task(self.stream(n, chunk))
        elif path.startswith("/_arrivals"):
            log, self.s.arrivals = self.s.arrivals, []
            self._send("200 OK", "application/json", json.dumps(log).encode())
        elif path.startswith("/v1/models"):
            self._send("200 OK", "application/json",
                       b'{"object":"list","data":[{"id":"bench-model","object":"model"}]}')
        elif path.startswith(("/health", "/flush_cache")):
            self._send("200 OK", "text/plain", b"ok")
        else:
            self._send("404 Not Found", "text/plain", b"not found")

    async def stream(self, n: int, chunk: bytes) -> None:
        framed = _framed(chunk)
        if self.s.ttft_s > 0:
            await asyncio.sleep(self.s.ttft_s)
        if self.s.gap_s <= 0:  # back to back: the same 64 chunk events, written in one syscall
            if self.transport is not None:
                self.transport.write(framed * n + self._tail(n))
            return
        for i in range(n):
            if self.transport is None:
                return
            if i and self.s.gap_s > 0:
                await asyncio.sleep(self.s.gap_s)
                if self.transport is None:
                    return
            self.transport.write(framed)
        if self.transport is not None:
            self.transport.write(self._tail(n))

    @staticmethod
    def _tail(n: int) -> bytes:
        usage = json.dumps({"id": "b", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n,
                                                                "total_tokens": 8 + n}}).encode()
        return _framed(b"data: " + usage + b"\n\n") + _framed(b"data: [DONE]\n\n") + b"0\r\n\r\n"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--core", type=int, help="pin this process to one CPU core")
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--ttft-ms", type=float, default=5.0)
    ap.add_argument("--gap-ms", type=float, default=0.0)
    args = ap.parse_args()
    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    srv = Server(args.chunks, args.ttft_ms / 1e3, args.gap_ms / 1e3)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Conn(srv), "127.0.0.1", args.port, backlog=4096)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())
