"""``python -m agent_core.app.worker``: the ``agent-worker`` command."""

from agent_core.app.worker.cli import main

main()
