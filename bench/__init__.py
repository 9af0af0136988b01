"""Benchmarks of issue 8: agent-broadcaster against the plain-``websockets`` and Node
socket.io references, on the same machine, in one run (see ``python -m bench --help``)."""
