"""Real in-process servers and Pusher clients for the envelope tests."""

from tests.server.conftest import clients, start_server  # noqa: F401
