"""Test helpers (fixtures stay in the conftest.py files that use them).

- :mod:`tests.support.processes`: private ``redis-server`` and ``agent-broadcaster serve``
  processes on free ports, waited for by their readiness line.
- :mod:`tests.support.live`: in-process servers under uvicorn and a small Pusher client.
- :mod:`tests.support.hub`: a scripted backend and recording connections for unit tests
  of the hub.
"""
