"""Orchestrators: processes of several steps built on the agent engine.

The step-by-step base (``stepbystep``), the process state and its serializer, the
ToolUse, Chat and Collaboration orchestrators with their turn machinery, the events
they emit, and capability routing (``orchestrators.routing``). See docs/agent_core.md.
"""
