"""A local server speaking the OpenAI chat-completions API (the ``api`` fixture in
tests/conftest.py serves it): scripted replies, streamed as SSE chunks, and what it
received."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

API_KEY = "sk-test-0123456789"  # a test value, not a credential


@dataclass
class Reply:
    """What the server answers: ``pieces`` of body written one at a time, then either
    the end of the response or, with ``stall``, silence until the client goes away.
    ``stall_before_headers`` never answers at all."""

    pieces: list[bytes] = field(default_factory=list)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    media_type: str = "text/event-stream"
    stall: bool = False
    stall_before_headers: bool = False


@dataclass
class Received:
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class Script:
    reply: Reply
    base_url: str
    requests: list[Received] = field(default_factory=list)


class FakeChatAPI:
    """A chat-completions server whose replies tests script, one URL prefix per script."""

    def __init__(self) -> None:
        self.scripts: dict[str, Script] = {}
        self.port = 0

    def script(self, reply: Reply) -> Script:
        token = uuid.uuid4().hex
        script = Script(reply, f"http://127.0.0.1:{self.port}/{token}/v1")
        self.scripts[token] = script
        return script

    def app(self) -> Starlette:
        return Starlette(
            routes=[Route("/{token}/v1/chat/completions", self._chat, methods=["POST"])]
        )

    async def _chat(self, request: Request) -> Response:
        script = self.scripts[request.path_params["token"]]
        script.requests.append(Received(await request.json(), dict(request.headers)))
        reply = script.reply
        if reply.stall_before_headers:
            await _until_disconnected(request)
            return Response(status_code=504)
        return StreamingResponse(
            _body(reply),
            status_code=reply.status,
            headers=reply.headers,
            media_type=reply.media_type,
        )


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _body(reply: Reply) -> AsyncIterator[bytes]:
    for piece in reply.pieces:
        yield piece
    if reply.stall:
        # Starlette cancels this when the client disconnects (its read timeout).
        await asyncio.sleep(60)


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` as OpenAI streams it."""
    choices = (
        []
        if delta is None and finish is None
        else [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}]
    )
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "fake-model",
        "choices": choices,
        "usage": usage,
    }


def text(content: str) -> dict[str, Any]:
    return chunk({"content": content})


def tool(
    index: int, id: str | None = None, name: str | None = None, args: str = ""
) -> dict[str, Any]:
    fragment: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if id is not None:
        fragment |= {"id": id, "type": "function"}
        fragment["function"]["name"] = name
    return chunk({"tool_calls": [fragment]})


def usage(prompt: int, completion: int, total: int | None = None) -> dict[str, Any]:
    total = prompt + completion if total is None else total
    return chunk(
        usage={"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
    )


def sse(*chunks: dict[str, Any] | str, done: bool = True) -> list[bytes]:
    """Each chunk as one ``data:`` event (a str is sent verbatim), then ``[DONE]``."""
    payloads = [c if isinstance(c, str) else json.dumps(c) for c in chunks]
    if done:
        payloads.append("[DONE]")
    return [f"data: {payload}\n\n".encode() for payload in payloads]
