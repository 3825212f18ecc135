"""The viewer shows a trace's images: a stored one from the run folder's `images/` by its hash name only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tracegym.core.episode import Episode
from tracegym.core.image_ref import image_ref, stored_name
from tracegym.core.messages import ImagePart, user
from tracegym.eval.run_folder import RunFolder
from tracegym.testing.images import image_trace, png
from tracegym.view.app import make_app
from tracegym.view.message_view import message_html
from tracegym.view.run_folder_index import RunFolderIndex

NAME = str(stored_name(image_ref(png())))


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[TestClient]:
    folder = RunFolder.create(tmp_path, "colours", "fake-model", run_id="run")
    folder.write_config({"taskset": "colours", "model": {"name": "fake-model"}})
    folder.log.append(Episode.solo(image_trace()))
    folder.log.close()
    (folder.path / "secret.png").write_bytes(png((0, 0, 0)))
    index = RunFolderIndex.open(folder.path)
    index.refresh()
    client = TestClient(TestServer(make_app(index, follow=False)))
    await client.start_server()
    yield client
    await client.close()


async def test_a_trace_page_shows_each_stored_image_from_the_image_route(client):
    page = await (await client.get("/trace/0")).text()
    assert page.count(f'<img class="image" src="/image/{NAME}"') >= 2  # the prompt's and the tool result's


async def test_the_image_route_serves_the_stored_bytes_with_their_type(client):
    response = await client.get(f"/image/{NAME}")
    assert response.status == 200 and await response.read() == png()
    assert response.headers["Content-Type"] == "image/png"
    assert response.headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize("name", ["..%2Fsecret.png", "secret.png", "0" * 64 + ".png", NAME.replace("png", "svg")])
async def test_the_image_route_serves_nothing_but_a_stored_hex_name(client, name):
    response = await client.get(f"/image/{name}")
    assert response.status == 404 and "Traceback" not in await response.text()


def test_an_inline_image_of_a_stored_format_is_shown_from_its_data_uri():
    url = "data:image/png;base64,iVBORw0KGgo="
    assert f'<img class="image" src="{url}"' in message_html(user([ImagePart(image_url={"url": url})]))


def test_an_image_elsewhere_is_named_never_fetched():
    html = message_html(user([ImagePart(image_url={"url": "https://example.com/cat.png"})]))
    assert "<img" not in html and "[image: https://example.com/cat.png]" in html
