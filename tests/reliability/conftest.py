"""Fixtures for the reliability tests: in-process servers and Pusher clients (from
tests/server), real server processes and killable Redis servers (from tests/conftest)."""

from tests.server.conftest import clients, start_server  # noqa: F401
