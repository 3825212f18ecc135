"""Image store: a run folder's `images/` directory, where each image its trace rows carry is kept once by content
hash (`images/<sha256>.<ext>`), and the rows name it by reference (`core.image_ref`).

`stored(line)` is a record's JSON line (a trace's, an episode record's: its task row may hold images too) with
its images stored and referenced; `parse(line, model)` reads one back with the data URIs put in again (a missing
file leaves its reference, and `missing` names it). A line without an image costs one substring test each way.
Files are written whole under a temporary name and renamed, so two writers of the same image (an eval and its
resume, the orchestrator and a held-out evaluation) never leave half a file.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from tracegym.core.image_ref import REF_PREFIX, data_uri, from_refs, image_ref, mime_of, stored_name, to_refs

M = TypeVar("M", bound=BaseModel)

IMAGES = "images"
"""The folder, inside a run folder, that holds its images."""
_INLINE = ";base64,"
_REF = REF_PREFIX.encode()


@dataclass
class ImageStore:
    """The images of one run folder (`folder`: its `images/` directory, made when the first image is stored)."""

    folder: Path
    missing: set[str] = field(default_factory=set)
    """The names of the images referenced by rows read whose file is not there (left as references)."""
    _known: set[str] = field(default_factory=set, repr=False)
    _read: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, run_folder: Path) -> ImageStore:
        """The store of the run folder at `run_folder`."""
        return cls(run_folder / IMAGES)

    def stored(self, line: str) -> str:
        """A record's JSON line (no newline) with its images stored here and referenced."""
        if _INLINE not in line:
            return line
        return json.dumps(to_refs(json.loads(line), self.put), ensure_ascii=False, separators=(",", ":"))

    def parse(self, line: bytes, model: type[M]) -> M:
        """A record read from its JSON line, each reference replaced by its image's data URI (a ValueError or
        pydantic's ValidationError when the line is not one, as `model_validate_json` raises)."""
        if _REF not in line:
            return model.model_validate_json(line)
        return model.model_validate(from_refs(json.loads(line), self.data_uri))

    def put(self, data: bytes) -> str:
        """Store an image (once: a file already there is kept) and return its reference."""
        ref = image_ref(data)
        name = ref[len(REF_PREFIX):]
        if name not in self._known:
            path = self.folder / name
            if not path.exists():
                self.folder.mkdir(parents=True, exist_ok=True)
                partial = path.with_name(f".{name}.{secrets.token_hex(4)}.partial")
                partial.write_bytes(data)
                os.replace(partial, path)
            self._known.add(name)
        return ref

    def path(self, name: str) -> Path | None:
        """The file of a stored image by its name (`<sha256>.<ext>`); None for a name that is not one (anything
        but hex digits and a known extension) or whose file is not there."""
        if stored_name(REF_PREFIX + name) is None:
            return None
        path = self.folder / name
        return path if path.is_file() else None

    def data_uri(self, name: str) -> str | None:
        """A stored image as a data URI (read once, then shared by every row that names it); None when missing."""
        if name not in self._read:
            path = self.path(name)
            if path is None:
                self.missing.add(name)
                return None
            self._read[name] = data_uri(mime_of(name), path.read_bytes())
        return self._read[name]
