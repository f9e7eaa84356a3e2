"""Load trimflow into mitmproxy: `mitmdump -s addon/mitm.py` (or mitmweb, or your own mitmproxy).

The addons live in the `trimflow.proxy` package beside this file, which takes precedence over any
installed copy so that a checkout runs its own code.
"""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from trimflow._dependencies import require  # noqa: E402  (needs the path above)

require()

from trimflow.proxy import addons  # noqa: E402

__all__ = ["addons"]
