"""A private ``redis-server`` for one bench run: a free port, nothing kept on disk."""

from __future__ import annotations

import asyncio
import shutil
import tempfile

from bench._proc import Child, ChildFailed, free_port

__all__ = ["PrivateRedis"]


class PrivateRedis:
    """``redis-server`` on 127.0.0.1 and a free port, with persistence turned off."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ChildFailed("redis-server is not installed (scripts/install --test installs it)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", self.dir, "--logfile", ""]
        self.child = Child("redis-server", argv)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.child.pid

    async def start(self, within: float = 10) -> PrivateRedis:
        await self.child.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not await self._pong():
            if self.child.proc is not None and self.child.proc.returncode is not None:
                raise self.child.failure("exited")
            if loop.time() > deadline:
                raise self.child.failure(f"no PONG within {within}s")
            await asyncio.sleep(0.02)
        return self

    async def _pong(self) -> bool:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        try:
            writer.write(b"PING\r\n")
            await writer.drain()
            return (await reader.readline()).startswith(b"+PONG")
        except OSError:
            return False
        finally:
            writer.close()

    async def stop(self) -> None:
        await self.child.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
