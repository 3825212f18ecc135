"""The `[model]` section: one declaration of the model settings, mapped onto the Endpoint in one place."""

import pytest
from pydantic import ValidationError

from tracegym.models.model_choice import ModelChoice
from tracegym.train.rl_config import RLModel


def test_the_network_policy_reaches_the_endpoint():
    choice = ModelChoice(timeout=7, max_retries=9, backoff=0.25, client="tokens", renderer="qwen3",
                         api_key_env="MY_KEY")
    endpoint = choice.endpoint("http://host:8000/v1", "served")
    assert (endpoint.timeout, endpoint.max_retries, endpoint.backoff) == (7, 9, 0.25)
    assert (endpoint.client, endpoint.renderer, endpoint.api_key_env) == ("tokens", "qwen3", "MY_KEY")
    assert endpoint.tokenizer == "served"  # an endpoint elsewhere: its model name is the tokenizer's hub id


def test_a_server_started_here_takes_no_key_and_its_weights_hold_the_tokenizer():
    endpoint = ModelChoice().endpoint("http://127.0.0.1:1/v1", "SmolLM2", weights="/models/smol")
    assert endpoint.api_key_env is None and endpoint.tokenizer == "/models/smol"
    named = ModelChoice(tokenizer="/tok").endpoint("http://127.0.0.1:1/v1", "SmolLM2", weights="/models/smol")
    assert named.tokenizer == "/tok"


def test_a_command_that_serves_the_model_itself_refuses_a_base_url():
    with pytest.raises(ValidationError, match="starts the vLLM server itself"):
        RLModel(base_url="http://host:8000/v1")
    assert ModelChoice(base_url="http://host:8000/v1").base_url == ["http://host:8000/v1"]  # one URL is a list of one


def test_rl_keeps_its_own_defaults_for_a_section_given_in_part():
    assert (RLModel().client, RLModel().max_model_len) == ("tokens", 1024)
    assert RLModel.model_validate({"name": "m"}).client == "tokens"
    assert (ModelChoice().client, ModelChoice().max_model_len) == ("chat", 2048)


def test_a_servers_startup_timeout_comes_from_the_model_section(tmp_path):
    from tracegym.models.launch import server_config

    config = server_config(ModelChoice(name=str(tmp_path), startup_timeout=900))
    assert config.startup_timeout_s == 900
