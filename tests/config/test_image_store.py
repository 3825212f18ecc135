"""The image store: a run folder's images kept once by hash, its rows holding references, read back as data URIs."""

import json

from tracegym.config.episode_log import EpisodeLog
from tracegym.config.image_store import ImageStore
from tracegym.core.episode import Episode
from tracegym.core.image_ref import REF_PREFIX
from tracegym.testing.images import image_trace as _image_trace
from tracegym.testing.images import png as _png


def _log(root) -> EpisodeLog:
    return EpisodeLog(root / "traces.jsonl", root / "episodes.jsonl", images=ImageStore.of(root))


def test_a_trace_with_images_reads_back_equal(tmp_path):
    log = _log(tmp_path)
    written = [Episode.solo(_image_trace()), Episode.solo(_image_trace((0, 0, 255)))]
    for episode in written:
        log.append(episode)
    log.close()
    assert _log(tmp_path).read().episodes == written


def test_each_image_is_stored_once_and_the_rows_hold_references(tmp_path):
    log = _log(tmp_path)
    log.write([Episode.solo(_image_trace()) for _ in range(3)])
    assert len(list((tmp_path / "images").iterdir())) == 1
    rows = log.traces.read_text() + log.episodes.read_text()
    assert ";base64," not in rows and REF_PREFIX in rows


def test_the_stored_file_holds_the_image_bytes_under_their_hash(tmp_path):
    _log(tmp_path).write([Episode.solo(_image_trace())])
    [stored] = (tmp_path / "images").iterdir()
    assert stored.read_bytes() == _png((255, 0, 0)) and stored.suffix == ".png"


def test_a_missing_image_file_leaves_its_reference_and_is_counted(tmp_path):
    _log(tmp_path).write([Episode.solo(_image_trace())])
    for path in (tmp_path / "images").iterdir():
        path.unlink()
    log = _log(tmp_path)
    [trace] = log.read().traces
    assert trace.messages[0].content[0].image_url["url"].startswith(REF_PREFIX)
    assert log.images is not None and len(log.images.missing) == 1


def test_a_log_without_a_store_keeps_images_inline(tmp_path):
    log = EpisodeLog(tmp_path / "traces.jsonl", tmp_path / "episodes.jsonl")
    log.write([Episode.solo(_image_trace())])
    assert ";base64," in log.traces.read_text() and not (tmp_path / "images").exists()


def test_a_path_is_given_only_for_a_hex_name_of_a_stored_file(tmp_path):
    store = ImageStore.of(tmp_path)
    name = store.put(_png((1, 2, 3))).removeprefix(REF_PREFIX)
    assert store.path(name) == tmp_path / "images" / name
    (tmp_path / "secret.png").write_bytes(b"x")
    assert store.path("../secret.png") is None and store.path("0" * 64 + ".png") is None


def test_rows_with_images_are_smaller_with_references_than_inline(tmp_path):
    stored, inline = _log(tmp_path / "a"), EpisodeLog(tmp_path / "b.jsonl", tmp_path / "b-episodes.jsonl")
    episodes = [Episode.solo(_image_trace()) for _ in range(4)]
    stored.write(episodes)
    inline.write(episodes)
    assert stored.traces.stat().st_size < inline.traces.stat().st_size
    assert json.loads(stored.traces.read_text().splitlines()[0])["task"]["id"] == "image-255-0-0"
