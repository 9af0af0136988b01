"""``--profile``: sample a Python server's stacks with py-spy during a measured window.

The raw (collapsed stacks) file can be opened in https://www.speedscope.app or turned
into a flame graph; :func:`summary` prints the functions with the most samples.
"""

from __future__ import annotations

import shutil
import signal
from collections import Counter
from pathlib import Path

from bench._proc import REPO, Child, ChildFailed

__all__ = ["start_profiler", "stop_profiler", "summary"]

PYTHON_SERVERS = ("broadcaster", "websockets", "uvicorn")


def _argv(pid: int, out: Path) -> list[str]:
    spy = shutil.which("py-spy") or str(REPO / ".venv" / "bin" / "py-spy")
    if not Path(spy).exists():
        raise ChildFailed("py-spy is missing: scripts/install --test installs it")
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "250"]
    return [*argv, "--function", "--nonblocking", "--output", str(out)]


async def start_profiler(pid: int, out: Path) -> Child:
    """py-spy sampling process ``pid`` into ``out`` (collapsed stacks) until stopped."""
    return await Child("py-spy", _argv(pid, out)).start()


async def stop_profiler(child: Child) -> None:
    """Stop sampling (SIGINT makes py-spy write its file)."""
    await child.stop(grace=20, sig=signal.SIGINT)


def summary(path: Path, top: int = 15) -> str:
    """The ``top`` functions by own samples and by samples including callees."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    if not samples:
        return f"{path.name}: no samples"
    lines = [f"{path.relative_to(REPO)}: {samples} samples", "  own%  total%  function"]
    for frame, n in own.most_common(top):
        lines.append(f"  {100 * n / samples:4.1f}  {100 * total[frame] / samples:6.1f}  {frame}")
    return "\n".join(lines)
