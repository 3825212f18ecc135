"""Several inference endpoints in the `[model]` section: listed URLs (duplicates and dead ones left out, with a
warning; none answering refused; a host that does not resolve named) and several vLLM servers started here."""

import logging
from pathlib import Path

import pytest

import tracegym as tg
from tracegym.models.launch import reach, serve
from tracegym.models.model_choice import ModelChoice
from tracegym.models.vllm_server import VLLMServerConfig, is_cpu_build, server_command
from tracegym.models.vllm_servers import CORES_ENV, core_shares, server_configs
from tracegym.testing import FakeOpenAIServer


@pytest.fixture
def fakes():
    servers = [FakeOpenAIServer(["hi"], model="m").start() for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


def dead_url() -> str:
    server = FakeOpenAIServer(["hi"]).start()
    server.stop()
    return server.base_url


def test_several_urls_become_one_endpoint_with_replicas(fakes):
    a, b = fakes
    endpoint = reach(ModelChoice(base_url=[a.base_url, b.base_url]))
    assert (endpoint.model, endpoint.servers()) == ("m", [a.base_url, b.base_url])


def test_a_duplicate_and_a_dead_url_are_left_out_with_a_warning(fakes, caplog):
    a, _ = fakes
    dead = dead_url()
    with caplog.at_level(logging.WARNING):
        endpoint = reach(ModelChoice(base_url=[dead, a.base_url, a.base_url + "/"]))
    assert endpoint.servers() == [a.base_url]
    assert f"lists {a.base_url}/ twice" in caplog.text and f"{dead} left out" in caplog.text


def test_none_answering_is_refused_naming_each():
    dead = [dead_url(), dead_url()]
    with pytest.raises(tg.UsageError, match=r"no server in --model\.base-url answers") as caught:
        reach(ModelChoice(base_url=dead))
    assert all(url in str(caught.value) for url in dead)


def test_a_host_that_does_not_resolve_is_named():
    url = "http://no-such-host.invalid:8000/v1"
    with pytest.raises(tg.UsageError, match=r"the host 'no-such-host.invalid' of .* does not resolve"):
        reach(ModelChoice(base_url=url, name="m"))


def test_a_server_of_another_model_is_left_out(fakes, caplog):
    a, b = fakes
    with FakeOpenAIServer(["hi"], model="other") as other, caplog.at_level(logging.WARNING):
        endpoint = reach(ModelChoice(base_url=[a.base_url, other.base_url, b.base_url]))
    assert endpoint.servers() == [a.base_url, b.base_url] and "does not serve model 'm'" in caplog.text


def test_the_eval_command_routes_rollouts_over_the_listed_servers(fakes, tmp_path):
    from tracegym.cli.main import main

    a, b = fakes
    args = ["eval", "reverse-text", "-n", "8", "--model.base-url", a.base_url, b.base_url, "--no-serve",
            "--no-rich", "--output-dir", str(tmp_path), "--model.api-key-env", "NO_SUCH_KEY"]
    assert main(args) == 0
    assert len(a.requests) + len(b.requests) == 8 and a.requests and b.requests


def test_servers_started_here_get_their_own_logs_and_cores():
    config = VLLMServerConfig(model="/m", log_path=Path("/run/logs/vllm.log"))
    configs = server_configs(config, 2)
    assert [c.log_path for c in configs] == [Path("/run/logs/vllm.log"), Path("/run/logs/vllm-1.log")]
    assert core_shares(2, [0, 1]) == ["0", "1"] and core_shares(3, [4, 5, 6, 7]) == ["4,5", "6", "7"]
    if is_cpu_build():
        assert [c.env[CORES_ENV] for c in configs] == core_shares(2)
    with pytest.raises(tg.UsageError, match="need at least 3 CPU cores"):
        core_shares(3, [0, 1])


def test_data_parallel_is_vllms_flag_on_the_gpu_build_and_refused_on_the_cpu_build():
    config = VLLMServerConfig(model="/m", data_parallel=2)
    if is_cpu_build():
        with pytest.raises(tg.UsageError, match="needs vLLM's GPU build"):
            server_command(config, 8000)
    else:
        assert server_command(config, 8000)[-2:] == ["--data-parallel-size", "2"]


def test_one_url_still_reaches_that_endpoint_alone(fakes):
    a, _ = fakes
    with serve(ModelChoice(base_url=a.base_url)) as endpoint:
        assert endpoint.replicas == () and endpoint.base_url == a.base_url
