"""trimflow's mitmproxy addons: the only part of trimflow that imports mitmproxy.

`addons` is the list mitmproxy loads (through `addon/mitm.py` or `trimflow/proxy/mitmdump_script.py`).
"""

from ._addon import META, Trimflow

addons = [Trimflow()]

__all__ = ["META", "Trimflow", "addons"]
