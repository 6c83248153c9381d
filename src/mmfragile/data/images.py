"""Image fields of the published benchmark files -> image files on disk (never decoded pixels in memory).

Benchmarks ship images in several ways: a path (relative to the annotation file or an image folder),
raw bytes (parquet ``image`` cells, HF ``{"bytes": ..., "path": ...}`` structs), base64 text (VLMEvalKit
TSVs: MMBench, HRBench, MME-RealWorld-Lite) or - in VLMEvalKit TSVs only - a short string naming the
``index`` of another row whose image is reused ("for saving space", ``vlmeval/dataset/image_base.py``:
a value of at most 64 characters is such a reference). :func:`image_field` turns any of these into
image *paths*; embedded images are written once to a content-addressed cache folder
(``$MMFRAGILE_CACHE/images/<dataset>/<sha256>.<ext>``), so a second load reads nothing but the table.

Integrity: an embedded image is checked when it is first written (a later load finds the cached file and
trusts it): it must decode - JPEGs are decoded in draft mode (DCT scaling to 1/8), which reads the whole
bitstream, so a truncated file is caught at a fraction of a full decode's cost (an 8K JPEG: ~20 ms instead
of ~300 ms and 100 MB); other formats go through ``Image.verify`` (PNG: chunk CRCs). The check lifts
PIL's decompression-bomb limit (:func:`pixel_limit_lifted`): it tests integrity, not size; how large an
image a model may take is the model side's resize policy.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

from mmfragile.paths import build_once, cache_dir
from mmfragile.errors import DataError

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
#: VLMEvalKit's rule: an ``image`` cell of at most this many characters names another row's index.
REFERENCE_MAX_CHARS = 64


@contextlib.contextmanager
def pixel_limit_lifted() -> Iterator[None]:
    """PIL's decompression-bomb guard off (and its warning silenced) inside the block only."""
    from PIL import Image

    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            yield
    finally:
        Image.MAX_IMAGE_PIXELS = old


def check_image_bytes(data: bytes, where: str) -> str:
    """Decode-check embedded image bytes (see the module docstring); returns the lower-case format name.
    :class:`DataError` naming ``where`` if they are not a complete, decodable image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with pixel_limit_lifted(), Image.open(io.BytesIO(data)) as im:
            fmt = (im.format or "").lower()
            if fmt == "jpeg":
                im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
                im.load()
            else:
                im.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise DataError(f"{where}: corrupt or unreadable embedded image: {e}") from e
    if not fmt:
        raise DataError(f"{where}: embedded image of unknown format")
    return fmt


#: File suffixes of the cache, most frequent first (PIL format name; JPEG as "jpg").
_COMMON_EXTS = ("jpg", "png", "webp", "gif", "bmp", "tiff", "mpo")


def store_image_bytes(data: bytes, where: str, dataset: str) -> str:
    """Write image bytes once (content-addressed) and return the file's path; checked on first write."""
    digest = hashlib.sha256(data).hexdigest()[:24]
    folder = cache_dir("images", dataset)
    for ext in _COMMON_EXTS:  # a few stat calls, not a scan of a folder of thousands of images
        if (folder / f"{digest}.{ext}").is_file():
            return str(folder / f"{digest}.{ext}")
    fmt = check_image_bytes(data, where)
    path = folder / f"{digest}.{'jpg' if fmt == 'jpeg' else fmt}"
    return str(build_once(path, lambda tmp: tmp.write_bytes(data), file=True))


def decode_base64(text: str, where: str) -> bytes:
    """Strict base64 (whitespace and line breaks, as some TSV writers wrap, are removed first)."""
    compact = "".join(text.split())
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as e:
        raise DataError(f"{where}: image field is not valid base64 ({e}); it starts {text[:40]!r}") from None


def looks_like_path(text: str, base: Path | None) -> bool:
    """Whether ``text`` (an image field) names a file rather than holding base64 data."""
    # base64 text never contains '.', so a string with an image suffix is a path. Anything long is data:
    # it is never handed to the file system (a 1 MB base64 JPEG as a file name -> OSError "name too long").
    if len(text) > 1024:
        return False
    if Path(text).suffix.lower() in IMAGE_EXTS:
        return True
    try:
        p = Path(text).expanduser()
        return (p if p.is_absolute() or base is None else base / p).is_file()
    except OSError:
        return False


def image_field(value: Any, base: Path | None, where: str, dataset: str,
                references: Mapping[str, str] | None = None) -> list[str]:
    """Image paths for one image cell: a path (relative to ``base``), a list of those, bytes, a
    ``{"bytes", "path"}`` dict, base64 text, a ``"['<b64>', ...]"`` list literal (VLMEvalKit multi-image
    TSVs) or - when ``references`` (row index -> image path) is given - another row's index.
    Empty cells give ``[]``. :class:`DataError` naming ``where`` for anything else."""
    if value is None or (isinstance(value, float) and value != value):
        return []
    if isinstance(value, (bytes, bytearray, memoryview)):
        return [store_image_bytes(bytes(value), where, dataset)]
    if isinstance(value, Mapping):
        if value.get("bytes") is not None:
            return image_field(value["bytes"], base, where, dataset)
        return image_field(value.get("path"), base, where, dataset)
    if isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and not isinstance(value, str)):
        out: list[str] = []
        for k, v in enumerate(list(value)):
            out += image_field(v, base, f"{where}, image {k + 1}", dataset, references)
        return out
    text = str(value).strip()
    if not text:
        return []
    if text.startswith("[") and text.endswith("]") and len(text) > 2:
        import ast

        try:
            items = ast.literal_eval(text)
        except (ValueError, SyntaxError) as e:
            raise DataError(f"{where}: image field looks like a list but does not parse: {e}") from None
        return image_field(list(items), base, where, dataset, references)
    if references is not None and len(text) <= REFERENCE_MAX_CHARS:
        if text not in references:
            raise DataError(f"{where}: image field {text!r} names no row with an image (VLMEvalKit rows reuse "
                            "another row's image by naming its index)")
        return [references[text]]
    if looks_like_path(text, base):
        p = Path(text).expanduser()
        if not p.is_absolute() and base is not None:
            p = base / p
        return [str(p)]
    return [store_image_bytes(decode_base64(text, where), where, dataset)]
