"""Screenshots that show the same screen: a small grayscale thumbnail of each, and the test of two.

Computer-use agents send long runs of nearly identical screenshots (waiting for a page, a spinner, a cursor that
moved, the clock a minute on), and each costs a slot under the cap that a distinct earlier screen could have kept.
A screenshot (a tool's or the agent's image, trimflow._media) is a look-alike when the image right after it in the
request is one too, of the same dimensions, and shows the same screen: their THUMBNAIL grayscale thumbnails (a box
filter over the whole image) differ by at most MAX_MEAN_DIFFERENCE grey levels on average, and by more than
CELL_DIFFERENCE in at most MAX_CELLS of their cells. The cut takes look-alikes first (trimflow._value), each with a
placeholder naming the image after it.

The thresholds come from screens drawn for it (trimflow.testing._screens; the bench's `lookalike` figures): the same
screen with the cursor moved, the clock on, a spinner at another frame differs by at most 0.15 on average and in at
most 3 cells, at 640x400 to 1920x1080, PNG, JPEG and WebP; any two of 48 distinct screens (other pages of one app,
the same page scrolled, a dialog open, other apps) by at least 1.3 and in at least 44 cells. Both margins are wide,
and a miss (two screens kept) costs a slot where a false match would cost a screen.

The relation is a pure function of the two images, so the same request gives the same look-alikes on every turn and
in every process: a look-alike cut on one turn keeps its placeholder on the next (the prompt cache). Thumbnails are
made only when asked (the engine asks on the turns where the cut moves, and for a cut image no memory says about),
never of an image over MAX_PIXELS, and kept by image key in a bounded cache (`Thumbnails`): a screenshot is decoded
about once in a process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from PIL import Image, ImageChops

from . import _shrink
from ._media import USER, Media
from ._placeholder import MediaFacts
from ._shrink import open_image

THUMBNAIL = (32, 20)
MAX_MEAN_DIFFERENCE = 0.5  # grey levels, over the thumbnail
CELL_DIFFERENCE, MAX_CELLS = 8, 8
CAPACITY = 4096  # thumbnails kept (640 bytes each)
# A larger image is never compared (decoding one costs its pixels in memory): past a 6K display's 20 megapixels.
MAX_PIXELS = 25_000_000


class NeedsThumbnails(Exception):
    """A thumbnail is not kept and may not be made here (the caller is on an event loop)."""


class Thumbnails:
    """Thumbnails by image key (trimflow._history.image_key), the least recently used forgotten past `capacity`;
    None for an image that cannot be made one. Safe from any thread."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.made = 0  # thumbnails decoded (for the tests and the bench)
        self._entries: OrderedDict[bytes, bytes | None] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes, media: Media, make: bool) -> bytes | None:
        """The thumbnail of `media`, whose key is `key`: kept, or made when `make` allows (else NeedsThumbnails)."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        if not make:
            raise NeedsThumbnails
        assert media.data is not None  # only images with bytes are compared
        made = thumbnail(media.data[media.data_offset :])
        with self._lock:
            self.made += 1
            self._entries[key] = made
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return made

    def __len__(self) -> int:
        return len(self._entries)


THUMBNAILS = Thumbnails()  # the process's (worker threads share it)


def thumbnail(payload: str) -> bytes | None:
    """The THUMBNAIL grayscale thumbnail of the image in base64 `payload` (a JPEG decoded at a reduced scale first);
    None when it cannot be decoded."""
    opened = open_image(payload)
    if isinstance(opened, str):
        return None
    im, _ = opened
    # Decoded within the shrinks' process-wide budget (trimflow._pixel_budget): at most its pixels in 4 bands and their
    # grey copy, a quarter more for the heap. An image that finds no room is not compared: it stays a distinct screen.
    cost = im.size[0] * im.size[1] * 5 * 5 // 4
    budget = _shrink.BUDGET  # looked up now: the process's, whatever replaced it since import
    if cost > budget.limit or not budget.reserve(cost):
        return None
    try:
        im.draft("L", (THUMBNAIL[0] * 2, THUMBNAIL[1] * 2))
        small = im.convert("L").resize(THUMBNAIL, Image.Resampling.BOX)
    except (OSError, ValueError, SyntaxError):
        return None
    finally:
        del im
        budget.release(cost)
    return small.tobytes()


def same_screen(a: bytes, b: bytes) -> bool:
    """Whether two thumbnails show the same screen (the module's docstring)."""
    difference = ImageChops.difference(Image.frombytes("L", THUMBNAIL, a), Image.frombytes("L", THUMBNAIL, b))
    counts = difference.histogram()
    total = sum(level * n for level, n in enumerate(counts))
    return total <= MAX_MEAN_DIFFERENCE * THUMBNAIL[0] * THUMBNAIL[1] and sum(counts[CELL_DIFFERENCE + 1 :]) <= MAX_CELLS


def lookalikes(images: Sequence[MediaFacts], which: Sequence[int], keys: Sequence[bytes], make: bool, cache: Thumbnails | None = None) -> set[int]:
    """Of the images `which` (indices into `images`, in document order), those that show the same screen as the image
    right after them. `keys`: each image's key. Raises NeedsThumbnails when a thumbnail is needed and `make` is
    False."""
    cache = THUMBNAILS if cache is None else cache
    found = set()
    for i in which:
        if i + 1 >= len(images) or not _comparable(images[i], images[i + 1]):
            continue
        if images[i].media.data == images[i + 1].media.data:
            found.add(i)  # the very same bytes: no thumbnail needed
            continue
        a, b = (cache.get(keys[j], images[j].media, make) for j in (i, i + 1))
        if a is not None and b is not None and same_screen(a, b):
            found.add(i)
    return found


def _comparable(a: MediaFacts, b: MediaFacts) -> bool:
    """Two screenshots (neither the user's) with bytes here, of the same known dimensions."""
    if a.media.origin == USER or b.media.origin == USER or a.media.data is None or b.media.data is None:
        return False
    x, y = a.info, b.info
    if x is None or y is None or not x.width or not x.height:
        return False
    return (x.width, x.height) == (y.width, y.height) and x.width * x.height <= MAX_PIXELS
