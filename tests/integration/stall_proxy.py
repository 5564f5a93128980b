"""A TCP proxy on loopback whose traffic a test can stall, in either direction, as a network would.

It runs its own event loop in a thread, so a test that blocks (kubectl, a sleep) does
not stall it by accident. `hold()` stops forwarding (what is sent meanwhile waits in
the proxy, as unacknowledged segments would wait in the sender's kernel); `release()`
forwards it. A client that resets its connection (RST) meanwhile has its held bytes
dropped, as a real network drops what the sender's kernel discarded on the reset; a
connection closed gracefully (FIN) still delivers them. That is the distinction an
operator relies on when it aborts its connections to fence off a write.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import yaml


class StallProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stall-proxy", daemon=True)
        self._open: dict[str, asyncio.Event] = {}
        self._server: asyncio.Server | None = None
        self.dropped = 0
        """Chunks held for a client that then reset its connection, never delivered."""
        self.held = 0
        """Chunks that arrived while their direction was held: a request is in flight."""
        self.connections = 0

    def start(self) -> StallProxy:
        self._thread.start()
        self.port = self._call(self._start())
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def kubeconfig(self, source: Path, path: Path) -> Path:
        """A copy of the kubeconfig at `source` whose server is this proxy: the client's
        traffic to the API server is what the test stalls."""
        config = yaml.safe_load(source.read_text())
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def hold(self, direction: str = "both") -> None:
        """Stop forwarding: "up" (client to server), "down" (server to client) or "both".
        In effect when this returns: nothing is forwarded after it (what was, may still land)."""
        self._call(self._gate(direction, False))

    def release(self, direction: str = "both") -> None:
        self._call(self._gate(direction, True))

    async def _gate(self, direction: str, open_: bool) -> None:
        for d in self._directions(direction):
            (self._open[d].set if open_ else self._open[d].clear)()

    @staticmethod
    def _directions(direction: str) -> tuple[str, ...]:
        return ("up", "down") if direction == "both" else (direction,)

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _start(self) -> int:
        self._open = {"up": asyncio.Event(), "down": asyncio.Event()}
        for event in self._open.values():
            event.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            self._pump(client_r, server_w, self._open["up"], client_r),
            self._pump(server_r, client_w, self._open["down"], client_r),
            return_exceptions=True,
        )
        for writer in (client_w, server_w):
            with contextlib.suppress(Exception):
                writer.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        gate: asyncio.Event,
        client: asyncio.StreamReader,
    ) -> None:
        while True:
            await gate.wait()
            try:
                data = await reader.read(65536)
            except (ConnectionError, OSError):
                break
            if not data:
                break
            if not gate.is_set():
                self.held += 1
            await gate.wait()
            if isinstance(client.exception(), ConnectionResetError):
                self.dropped += 1  # the client reset while this was held: it never arrives
                break
            writer.write(data)
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
