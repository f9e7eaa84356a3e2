"""The script `python -m trimflow run` hands to mitmdump (`-s`) for an installed trimflow: its `addons`, built
when mitmdump loads it."""

from trimflow.proxy import make_addons

addons = make_addons()

__all__ = ["addons"]
