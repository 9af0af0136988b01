"""The in-process server and Pusher client fixtures of tests/server, shared here."""

from tests.server.conftest import clients, start_server  # noqa: F401
