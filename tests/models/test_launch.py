"""Model choice -> endpoint: an existing URL is checked before use; names and failures are clear."""

import socket

import pytest

import tracegym as tg
from tracegym.models.embedded import SERVED_MODEL_NAME
from tracegym.models.launch import ModelChoice, serve, server_config
from tracegym.testing import FakeOpenAIServer


def test_an_existing_endpoint_is_used_with_its_only_model():
    with FakeOpenAIServer(["hi"], model="served-one") as fake, serve(ModelChoice(base_url=fake.base_url)) as endpoint:
        assert (endpoint.base_url, endpoint.model) == (fake.base_url, "served-one")


def test_a_model_the_endpoint_does_not_serve_is_a_usage_error():
    with FakeOpenAIServer(["hi"], model="served-one") as fake:
        choice = ModelChoice(base_url=fake.base_url, model="other")
        with pytest.raises(tg.UsageError, match=r"does not serve model 'other'.*served-one"), serve(choice):
            pass


def test_an_unreachable_endpoint_fails_fast_naming_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with pytest.raises(tg.InfrastructureError, match=f"{url}/models is unreachable"), serve(ModelChoice(base_url=url)):
        pass


def test_a_model_directory_is_served_under_its_last_path_part(tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    config = server_config(ModelChoice(model=str(model_dir)))
    assert config.model == str(model_dir) and config.name == "my-model"


def test_no_model_means_the_embedded_one():
    assert ModelChoice().display_name() == SERVED_MODEL_NAME
