"""Session endpoints: ``GET /api/sessions/{session_id}/state`` serves a session's final
slim snapshot (stored by whoever ran the agent, see
:class:`broadcaster.publishers.StateStore`), so a UI can reconcile what it built from
events with the final state."""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broadcaster.backends.base import BackendUnavailable
from broadcaster.node import Node
from broadcaster.publishers import state_key

__all__ = ["SESSION_ID", "routes"]

SESSION_ID = re.compile(r"^[A-Za-z0-9_\-=@,.;]{1,128}$")
"""Session ids are what may follow ``agent.`` in a channel name."""


def routes(node: Node) -> list[Route]:
    """The session routes, reading through ``node``'s backend."""

    async def state(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        if not SESSION_ID.match(session_id):
            return _error(400, f"invalid session id {session_id!r}: {SESSION_ID.pattern}")
        app_id = request.query_params.get("app_id") or node.apps[0].id
        if node.app_by_id(app_id) is None:
            return _error(404, f"unknown app {app_id!r}")
        try:
            snapshot = await node.backend.load_value(app_id, state_key(session_id))
        except BackendUnavailable as exc:
            return _error(503, str(exc))
        if snapshot is None:
            return _error(
                404,
                f"no final state for session {session_id!r}: unknown session, run still "
                "in progress, or its state expired",
            )
        return Response(snapshot, media_type="application/json")

    return [Route("/api/sessions/{session_id}/state", state, methods=["GET"])]


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
