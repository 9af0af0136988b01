"""Moved to :mod:`tests.support.reliability` (the one home of test helpers). This name
stays for ``tests/backends`` and ``tests/reliability/failover.py``, which move with the
Redis backend on another branch; import from ``tests.support.reliability`` instead."""

from tests.support.reliability import *  # noqa: F403
