"""Image reference: how a trace row on disk names an image its run folder stores once, by content hash.

In memory an image is an `ImagePart` whose `image_url.url` is usually a `data:` URI (base64). On disk, a run
folder keeps each image once as `images/<sha256>.<ext>` and its trace rows hold the reference
`tracegym-image:sha256:<sha256>.<ext>` in that URL's place (`to_refs`); a reader puts the data URI back
(`from_refs`). Only a base64 data URI whose declared type is one of `FORMATS` and whose bytes are that format is
stored (so reading it back gives the very same URI); any other URL stays in the row as it was.

>>> ref = image_ref(b"\\x89PNG\\r\\n\\x1a\\n...")
>>> ref.startswith("tracegym-image:sha256:") and ref.endswith(".png")
True
>>> stored_name(ref) == ref.removeprefix(REF_PREFIX)
True
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable
from typing import Any

REF_PREFIX = "tracegym-image:sha256:"
"""What a reference starts with; the stored file's name follows it."""
FORMATS = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp", "bmp": "image/bmp"}
"""The image formats stored by hash, and taken as model input (the raster formats a vision processor reads,
PIL's common ones): the file extension, by which its MIME type."""
_MAGIC = (("png", b"\x89PNG\r\n\x1a\n"), ("jpeg", b"\xff\xd8\xff"), ("gif", b"GIF87a"), ("gif", b"GIF89a"),
          ("bmp", b"BM"))
_NAME = re.compile(r"[0-9a-f]{64}\.(?:" + "|".join(FORMATS) + ")")
_DATA_URI = re.compile(r"data:([\w.+-]+/[\w.+-]+)((?:;[\w.+-]+=[\w.+-]+)*);base64,", re.ASCII)


def sniffed_format(data: bytes) -> str | None:
    """The format (a key of FORMATS) the bytes start like; None when none of them."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((name for name, magic in _MAGIC if data.startswith(magic)), None)


def decoded(url: str) -> tuple[str, bytes] | None:
    """A base64 `data:` URI's declared MIME type and its bytes; None for any other URL. A ValueError when its
    base64 is broken."""
    match = _DATA_URI.match(url)
    if match is None:
        return None
    try:
        return match.group(1).lower(), base64.b64decode(url[match.end():], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"its base64 is broken ({exc})") from None


def image_bytes(url: str) -> bytes:
    """The bytes of an image part's URL (a reward that looks at an image reads them so); a ValueError saying why
    not for anything but a base64 data URI (a reference whose file was missing when its row was read, a URL
    elsewhere, which is never fetched)."""
    if stored_name(url) is not None:
        raise ValueError(f"{url} was not found in its run folder's images/")
    found = decoded(url)
    if found is None:
        raise ValueError(f"not a base64 data URI: {url[:80]!r} (images elsewhere are never fetched)")
    return found[1]


def data_uri(mime: str, data: bytes) -> str:
    """The base64 `data:` URI of `data`."""
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_ref(data: bytes) -> str:
    """The reference to an image of a stored format (FORMATS; a ValueError otherwise) by its content hash."""
    kind = sniffed_format(data)
    if kind is None:
        raise ValueError("not an image of a stored format: " + ", ".join(FORMATS))
    return f"{REF_PREFIX}{hashlib.sha256(data).hexdigest()}.{kind}"


def stored_name(url: str) -> str | None:
    """The file name (`<sha256>.<ext>`) a reference names; None when `url` is not a well-formed reference (only
    hex digits and a known extension: a name that is safe as one path part)."""
    if not url.startswith(REF_PREFIX):
        return None
    name = url[len(REF_PREFIX):]
    return name if _NAME.fullmatch(name) else None


def mime_of(name: str) -> str:
    """The MIME type of a stored file by its extension."""
    return FORMATS[name.rsplit(".", 1)[-1]]


def storable(url: str) -> bytes | None:
    """The bytes to store for an image URL: those of a base64 data URI declaring one of FORMATS and holding it;
    None for anything else (another URL, another format, a declared type the bytes are not, broken base64),
    which then stays inline."""
    try:
        found = decoded(url)
    except ValueError:
        return None
    if found is None or found[0] != FORMATS.get(sniffed_format(found[1]) or ""):
        return None
    return found[1] if url.startswith(f"data:{found[0]};base64,") else None  # one with parameters stays inline


def to_refs(row: Any, put: Callable[[bytes], str]) -> Any:
    """`row` (JSON data) with each storable image URL (`storable`) of an `image_url` part replaced by what
    `put(its bytes)` returns (the reference, once stored)."""
    return _mapped(row, lambda url: put(data) if (data := storable(url)) is not None else url)


def from_refs(row: Any, get: Callable[[str], str | None]) -> Any:
    """`row` (JSON data) with each reference of an `image_url` part replaced by `get(its file name)` (the data
    URI), or kept where that gives None (the file is missing)."""
    def back(url: str) -> str:
        name = stored_name(url)
        return (get(name) or url) if name is not None else url
    return _mapped(row, back)


def _mapped(value: Any, url: Callable[[str], str]) -> Any:
    """`value` with `url` applied to every `image_url.url` of a part (`{"type": "image_url", "image_url": ...}`)."""
    if isinstance(value, list):
        return [_mapped(v, url) for v in value]
    if not isinstance(value, dict):
        return value
    if value.get("type") == "image_url" and isinstance(value.get("image_url"), dict) and isinstance(
            value["image_url"].get("url"), str):
        return {**value, "image_url": {**value["image_url"], "url": url(value["image_url"]["url"])}}
    return {k: _mapped(v, url) for k, v in value.items()}
