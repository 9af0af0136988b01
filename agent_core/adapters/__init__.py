"""Adapters from agent and orchestration events to the broadcaster's envelope.

These use only the broadcaster's client-side pieces (envelope, publishers), never its
server modules; the rule is enforced by tests/test_architecture.py.
"""
