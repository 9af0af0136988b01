"""The agent lifecycle engine: immutable state, continuation criteria, lifecycle
observers, tools, model drivers, events and serialization."""

__all__ = ["__version__"]

__version__ = "0.1.0"
