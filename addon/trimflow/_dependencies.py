"""Say exactly which package is missing when trimflow is loaded into a mitmproxy that lacks one.

mitmproxy installed with pipx or Homebrew has its own environment, without trimflow's three
packages; a bare ModuleNotFoundError deep in an import would not say how to add them.
"""

from __future__ import annotations

import importlib.util

# import name -> distribution name
REQUIRED = {"orjson": "orjson", "yaml": "pyyaml", "PIL": "pillow"}


class MissingDependency(ImportError):
    """A package trimflow needs is not installed where it runs."""


def missing() -> list[str]:
    """The distributions trimflow needs that this Python cannot import."""
    return [dist for module, dist in REQUIRED.items() if importlib.util.find_spec(module) is None]


def require() -> None:
    """Raise MissingDependency, whose message is one line telling how to add what is missing."""
    absent = missing()
    if absent:
        names = " ".join(absent)
        raise MissingDependency(
            f"trimflow needs {', '.join(absent)} in mitmproxy's Python: pip install {names} "
            f"(pipx: pipx inject mitmproxy {names}; Homebrew: $(brew --prefix mitmproxy)/libexec/bin/pip install {names})"
        )
