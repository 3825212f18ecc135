"""The RL launcher's watch over several vLLM servers: one dying is reported and the run goes on; the last ends it."""

import io

import pytest

import tracegym as tg
from tracegym.models.vllm_server import VLLMServerConfig
from tracegym.models.vllm_servers import CORES_ENV, VLLMServers
from tracegym.train.launcher import check_servers


def test_one_of_several_vllm_servers_dying_is_reported_once_and_the_last_one_ends_the_run(tmp_path):
    config = VLLMServerConfig(model="/m", log_path=tmp_path / "vllm.log", env={CORES_ENV: "0"})
    servers = VLLMServers(config, 2)
    (tmp_path / "vllm-1.log").write_text("engine core died\n")
    alive = [True, True]
    for i, server in enumerate(servers.servers):
        server.running = lambda i=i: alive[i]  # type: ignore[method-assign]
    lost: set[str] = set()
    out = io.StringIO()
    check_servers(servers, lost, out)
    assert out.getvalue() == ""
    alive[1] = False
    check_servers(servers, lost, out)
    check_servers(servers, lost, out)
    assert out.getvalue().count("a vLLM server died; going on with the other 1") == 1
    assert "engine core died" in out.getvalue()
    alive[0] = False
    with pytest.raises(tg.InfrastructureError, match="vLLM died"):
        check_servers(servers, lost, out)
