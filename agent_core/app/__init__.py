"""The composition root: runs, the worker, the demo extension and the AG-UI endpoint.

The only part of ``agent_core`` allowed to import the broadcaster's server modules
(node, sessions, settings, ...); tests/test_architecture.py enforces it.
"""
