"""Image references: what is stored by hash, what stays inline, and the round trip of a row."""

import base64
import hashlib

import pytest

from tracegym.core.image_ref import (
    REF_PREFIX,
    data_uri,
    decoded,
    from_refs,
    image_ref,
    sniffed_format,
    storable,
    stored_name,
    to_refs,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 20
JPEG = b"\xff\xd8\xff\xe0" + b"\x00" * 20


def _part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url, "detail": "low"}}


def test_a_png_is_referenced_by_the_sha256_of_its_bytes():
    assert image_ref(PNG) == f"{REF_PREFIX}{hashlib.sha256(PNG).hexdigest()}.png"


def test_formats_are_sniffed_from_the_bytes_not_the_declared_type():
    assert [sniffed_format(b) for b in (PNG, JPEG, b"GIF89a..", b"RIFF\0\0\0\0WEBPVP8 ", b"<svg/>")] == [
        "png", "jpeg", "gif", "webp", None]


def test_only_a_base64_data_uri_whose_bytes_match_its_declared_type_is_storable():
    assert storable(data_uri("image/png", PNG)) == PNG
    assert storable(data_uri("image/jpeg", PNG)) is None  # declared jpeg, holds png: kept inline, as written
    assert storable(data_uri("image/svg+xml", b"<svg/>")) is None
    assert storable("https://example.com/cat.png") is None
    assert storable("data:image/png;base64,@@@") is None


def test_broken_base64_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="base64"):
        decoded("data:image/png;base64,abc")


def test_a_stored_name_is_only_hex_and_a_known_extension():
    good = image_ref(PNG)
    assert stored_name(good) == good.removeprefix(REF_PREFIX)
    for bad in (REF_PREFIX + "../../etc/passwd", REF_PREFIX + "ab.png", REF_PREFIX + "f" * 64 + ".svg",
                "data:image/png;base64,AAAA"):
        assert stored_name(bad) is None


def test_a_row_round_trips_through_references_with_its_other_keys_kept():
    row = {"task": {"prompt": [{"role": "user", "content": [_part(data_uri("image/png", PNG)),
                                                            {"type": "text", "text": "what colour?"}]}]},
           "other": [_part("https://example.com/x.png")]}
    stored: dict[str, bytes] = {}

    def put(data: bytes) -> str:
        stored[image_ref(data).removeprefix(REF_PREFIX)] = data
        return image_ref(data)

    out = to_refs(row, put)
    part = out["task"]["prompt"][0]["content"][0]
    assert part["image_url"] == {"url": image_ref(PNG), "detail": "low"}
    assert out["other"] == row["other"]
    assert from_refs(out, lambda name: data_uri("image/png", stored[name])) == row


def test_a_reference_whose_file_is_missing_stays_a_reference():
    row = [_part(image_ref(PNG))]
    assert from_refs(row, lambda name: None) == row


def test_data_uri_is_standard_base64():
    assert data_uri("image/png", PNG) == "data:image/png;base64," + base64.b64encode(PNG).decode()
