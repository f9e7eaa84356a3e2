"""What the property and fuzz tests draw from: real images, any text, and the count limits."""

from __future__ import annotations

from hypothesis import strategies as st

from trimflow.testing import image

# A pool of distinct real images, so the newest kept can be told apart from the rest.
POOL = [image(8 + i, 8, "PNG", seed=i) for i in range(12)]

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
limits = st.fixed_dictionaries(
    {
        "max_images": st.one_of(st.none(), st.integers(0, 6)),
        "keep_recent": st.integers(0, 3),
        "prune_batch": st.integers(1, 4),
    }
)
