"""Build hook (hatchling): compile ``broadcaster/_routes_c.c``, the direct routes' C
definition (see :mod:`broadcaster._routes`), next to its source.

It compiles with the C compiler Python was built with and Python's headers. Without
them, the install goes on: the Python definition serves, at about twice the
instructions per delivered message. The tests fail in CI when the compiled module is
missing or older than its source (``tests/broadcaster/test_routes.py``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SOURCE = Path("broadcaster") / "_routes_c.c"

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # not building: the tests import compile_extension (a sanitizer build)
    pass
else:

    class CompileRoutes(BuildHookInterface):  # type: ignore[type-arg]
        """Compile the extension in place; a wheel then carries it (platform-tagged)."""

        def initialize(self, version: str, build_data: dict[str, Any]) -> None:
            root = Path(self.root)
            target = SOURCE.with_name("_routes_c" + str(sysconfig.get_config_var("EXT_SUFFIX")))
            if not compile_extension(root / SOURCE, root / target):
                return
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            if version != "editable":
                build_data["force_include"][str(root / target)] = str(target)


def compiler() -> list[str]:
    """The C compiler Python was built with."""
    return shlex.split(sysconfig.get_config_var("CC") or "cc")


def compile_extension(source: Path, target: Path, extra: Sequence[str] = ()) -> bool:
    """Compile ``source`` into the extension module ``target`` (with the ``extra``
    compiler flags); False (and a warning on stderr) when it cannot be compiled here."""
    flags = shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC")
    include = sysconfig.get_paths()["include"]
    # Warnings fail the build in CI only: another compiler's new warning must not send a
    # user's install to the slower Python definition.
    strict = ["-Werror"] if os.environ.get("CI") == "true" else []
    command = [
        *compiler(),
        *flags,
        "-shared",
        "-O2",
        "-Wall",
        *strict,
        "-Wno-missing-field-initializers",
        f"-I{include}",
        *extra,
        str(source),
        "-o",
        str(target),
    ]
    try:
        # The compiler Python was built with, on this repository's own source.
        done = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603
    except OSError as exc:
        done = None
        problem = str(exc)
    else:
        problem = done.stderr.strip()
    if done is not None and done.returncode == 0:
        return True
    print(
        f"warning: {source} was not compiled ({' '.join(command)}: {problem}); the "
        "Python definition of broadcaster._routes serves instead",
        file=sys.stderr,
    )
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"{source} must compile in CI: {problem}")
    return False
