"""Images through the env server: a taskset whose prompts and tool results carry images runs in a worker, its traces
come back over the wire with every image, and a run folder stores each once."""

import pytest
from serve_helpers import running_server

from tracegym import Endpoint
from tracegym.core.episode import Episode
from tracegym.core.messages import ImagePart
from tracegym.envs.registry import load_taskset
from tracegym.eval.run_folder import RunFolder
from tracegym.serve import EnvClient
from tracegym.testing import FakeOpenAIServer


def _images(trace) -> list[str]:
    return [p.image_url["url"] for m in trace.messages if isinstance(m.content, list) for p in m.content
            if isinstance(p, ImagePart)]


@pytest.mark.slow
async def test_an_image_taskset_served_returns_its_images_and_the_folder_stores_them_once(tmp_path):
    row = load_taskset("colour-codeword", {"num_tasks": 1})[0]
    with FakeOpenAIServer(["falcon"]) as fake, running_server(spec="colour-codeword") as server:
        endpoint = Endpoint(base_url=fake.base_url, model=fake.model, api_key_env=None, max_retries=0)
        async with EnvClient(server.bound) as client:
            traces = await client.run(row, endpoint, rollout_indices=[0, 1])
    sent = [p for m in fake.requests[0]["messages"] for p in (m["content"] if isinstance(m["content"], list) else [])
            if p.get("type") == "image_url"]
    assert [p["image_url"]["url"] for p in sent] == _images(traces[0])  # the model was sent the picture
    assert all(t.ok and _images(t) == _images(traces[0]) and t.task == row for t in traces)
    folder = RunFolder.create(tmp_path, "colour-codeword", "fake", run_id="run")
    for trace in traces:
        folder.log.append(Episode.solo(trace))
    folder.log.close()
    assert len(list(folder.images.folder.iterdir())) == 1
    assert [t.model_dump() for t in folder.log.read().traces] == [t.model_dump() for t in traces]
