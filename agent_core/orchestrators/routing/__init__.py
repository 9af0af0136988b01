"""Capability routing: capabilities, the intent classifier, the continuation decider,
session memory and the router that ties them together. See docs/agent_core.md.
"""
