"""The script `python -m trimflow run` hands to mitmdump (`-s`) for an installed trimflow."""

from trimflow.proxy import addons

__all__ = ["addons"]
