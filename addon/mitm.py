"""Load trimflow into mitmproxy: `mitmdump -s addon/mitm.py` (or mitmweb, or your own mitmproxy).

The addons live in the `trimflow.proxy` package beside this file, which takes precedence over any
installed copy so that a checkout runs its own code.
"""

import importlib.util
import logging
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# A mitmproxy installed with pipx or Homebrew has a Python of its own, without trimflow's packages.
# Checked before importing trimflow, so that the user reads one line naming them, not a traceback.
REQUIRED = {"orjson": "orjson", "yaml": "pyyaml", "PIL": "pillow"}  # import name -> package
_missing = [package for module, package in REQUIRED.items() if importlib.util.find_spec(module) is None]

addons: list[object]
if _missing:
    _names = " ".join(_missing)
    # An error logged at startup makes mitmdump exit after printing it (mitmproxy's errorcheck addon).
    logging.getLogger("trimflow").error(
        f"trimflow needs {', '.join(_missing)} in mitmproxy's Python: pip install {_names} "
        f"(pipx: pipx inject mitmproxy {_names}; Homebrew: $(brew --prefix mitmproxy)/libexec/bin/pip install {_names})"
    )
    addons = []
else:
    from trimflow.proxy import make_addons

    addons = make_addons()

__all__ = ["addons"]
