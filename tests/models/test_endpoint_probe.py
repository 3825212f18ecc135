"""A command asks the model endpoint once whether it serves the model (one GET of `/v1/models`), whichever
path it takes: `--model.base-url` with or without `-m`, a resume, or a server `tracegym inference` recorded."""

import json
import os
from pathlib import Path

import pytest
from aiohttp import web

from tracegym.cli.main import main
from tracegym.models.launch import serve, server_config, server_record_path
from tracegym.models.model_choice import ModelChoice
from tracegym.testing import FakeOpenAIServer


class CountingServer(FakeOpenAIServer):
    """The fake endpoint, counting the listings of its models."""

    def __init__(self) -> None:
        super().__init__(rule=lambda request: "ok")
        self.listings = 0

    async def _models(self, request: web.Request) -> web.Response:
        self.listings += 1
        return await super()._models(request)


@pytest.fixture
def server():
    with CountingServer() as fake:
        yield fake


def eval_args(server: CountingServer, out: Path, *extra: str) -> list[str]:
    return ["eval", "reverse-text", "-n", "2", "--model.base-url", server.base_url, "--no-serve", "--no-rich",
            "--output-dir", str(out), *extra]


@pytest.mark.parametrize("named", [[], ["-m", "fake-model"]], ids=["only-model", "named"])
def test_eval_asks_the_endpoint_once(server, tmp_path, named):
    assert main(eval_args(server, tmp_path, *named)) == 0
    assert server.listings == 1


def test_a_resume_asks_the_endpoint_once(server, tmp_path):
    assert main(eval_args(server, tmp_path, "--run-id", "r")) == 0
    server.listings = 0
    assert main(["eval", "--resume", str(next(tmp_path.glob("*/r"))), "--no-rich"]) == 0
    assert server.listings == 1


def test_a_recorded_inference_server_is_asked_once(server, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGYM_CACHE", str(tmp_path / "cache"))
    model_dir = tmp_path / "fake-model"
    model_dir.mkdir()
    choice = ModelChoice(name=str(model_dir))
    config = server_config(choice)
    record = server_record_path(config)
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"base_url": server.base_url, "pid": os.getpid(), "launch_key": config.launch_key()}))
    with serve(choice) as endpoint:
        assert endpoint.base_url == server.base_url and endpoint.model == "fake-model"
    assert server.listings == 1
