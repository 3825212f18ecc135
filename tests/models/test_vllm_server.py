"""Tests of the vLLM server manager: command line, supervision, reuse, and no orphan after a kill -9."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from vllm_fakes import FAKE_VLLM, wait_until

from tracegym.core.errors import InfrastructureError
from tracegym.models import vllm_server
from tracegym.models.vllm_plugin import QUEUE_SPIN_ENV
from tracegym.models.vllm_server import (
    VLLMServer,
    VLLMServerConfig,
    free_port,
    recorded_server,
    server_command,
    server_env,
)
from tracegym.runtimes.processes import group_members, process_alive


def fake_server(tmp_path: Path, name: str = "fake-model", **fields: object) -> VLLMServer:
    port = free_port()
    config = VLLMServerConfig(
        model="unused", served_model_name=name, port=port, stop_grace_s=1.0, startup_timeout_s=20,
        log_path=tmp_path / f"vllm-{port}.log", **fields,
    )  # fmt: skip
    command = [sys.executable, "-c", FAKE_VLLM, str(port), name, str(tmp_path / f"engine-{port}.pid")]
    return VLLMServer(config, command=command)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[VLLMServer]:
    with fake_server(tmp_path) as started:
        yield started


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_command_line_and_env() -> None:
    config = VLLMServerConfig(
        model="/m", served_model_name="m", enable_lora=True, max_lora_rank=32, extra_args=["--seed", "1"]
    )
    cmd = server_command(config, 8123)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for part in ("--model /m", "--served-model-name m", "--port 8123", "--max-model-len 2048"):
        assert part in joined
    assert "--enforce-eager" in cmd
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in joined
    assert "--enable-lora --max-lora-rank 32" in joined
    assert cmd[-2:] == ["--seed", "1"]
    env = server_env(config)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    plain = server_command(VLLMServerConfig(model="/m", tool_call_parser=None, enforce_eager=False), 1)
    assert not {"--enable-auto-tool-choice", "--enforce-eager", "--enable-lora"} & set(plain)


def test_logprobs_are_those_of_the_distribution_sampled_from() -> None:
    cmd = server_command(VLLMServerConfig(model="/m"), 1)
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"


def test_cpu_build_sizes_the_kv_cache_in_bytes_fractions_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_server, "is_cpu_build", lambda: True)
    cmd = server_command(VLLMServerConfig(model="/m", cpu_kv_cache_gib=0.25), 1)
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(2**28)


def test_gpu_build_leaves_the_kv_cache_to_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_server, "is_cpu_build", lambda: False)
    assert "--kv-cache-memory-bytes" not in server_command(VLLMServerConfig(model="/m"), 1)


def test_cpu_build_gets_blocks_small_enough_to_share_short_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_server, "is_cpu_build", lambda: True)
    cmd = server_command(VLLMServerConfig(model="/m"), 1)
    assert cmd[cmd.index("--block-size") + 1] == "32"
    assert "--block-size" not in server_command(VLLMServerConfig(model="/m", cpu_block_size=None), 1)


def test_gpu_build_keeps_its_own_block_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_server, "is_cpu_build", lambda: False)
    assert "--block-size" not in server_command(VLLMServerConfig(model="/m"), 1)


def test_cpu_one_process_runs_the_model_worker_in_the_engine_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_server, "is_cpu_build", lambda: True)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    assert server_env(VLLMServerConfig(model="/m", cpu_one_process=True))["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in server_env(VLLMServerConfig(model="/m"))


def test_cpu_build_keeps_vllm_from_spinning_on_its_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_server, "is_cpu_build", lambda: True)
    assert server_env(VLLMServerConfig(model="/m"))[QUEUE_SPIN_ENV] == "0.0"
    assert QUEUE_SPIN_ENV not in server_env(VLLMServerConfig(model="/m", cpu_queue_spin_s=None))


def test_gpu_build_keeps_vllms_queue_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_server, "is_cpu_build", lambda: False)
    assert QUEUE_SPIN_ENV not in server_env(VLLMServerConfig(model="/m"))


def test_merging_adapters_loads_the_extension_and_opens_the_dev_routes() -> None:
    config = VLLMServerConfig(model="/m", merge_adapters=True)
    cmd = server_command(config, 1)
    assert cmd[cmd.index("--worker-extension-cls") + 1] == vllm_server.MERGE_EXTENSION
    assert server_env(config)["VLLM_SERVER_DEV_MODE"] == "1"
    assert "--worker-extension-cls" not in server_command(VLLMServerConfig(model="/m"), 1)


def test_launch_key_ignores_where_but_not_what() -> None:
    base = VLLMServerConfig(model="/m")
    assert base.launch_key() == VLLMServerConfig(model="/m", port=9, log_path=Path("/x")).launch_key()
    assert base.launch_key() != VLLMServerConfig(model="/m", max_model_len=4096).launch_key()


def test_early_exit_raises_with_the_log_tail(tmp_path: Path) -> None:
    config = VLLMServerConfig(model="unused", log_path=tmp_path / "vllm.log")
    script = "import sys; print('line one'); print('CUDA is sad', file=sys.stderr); sys.exit(3)"
    server = VLLMServer(config, command=[sys.executable, "-c", script])
    with pytest.raises(InfrastructureError, match=r"(?s)exited with code 3.*line one.*CUDA is sad"):
        server.start()
    assert not server.owned


def test_startup_timeout_stops_the_group(tmp_path: Path) -> None:
    config = VLLMServerConfig(model="m", startup_timeout_s=1.0, stop_grace_s=1.0, log_path=tmp_path / "l")
    server = VLLMServer(config, command=[sys.executable, "-c", "import time; time.sleep(600)"])
    started = time.monotonic()
    with pytest.raises(InfrastructureError, match="not healthy after 1 s"):
        server.start()
    assert time.monotonic() - started < 10


def test_start_answers_and_stop_kills_the_whole_group(server: VLLMServer, tmp_path: Path) -> None:
    assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")
    pgid = server.pid
    assert pgid is not None
    engine_pid = int(next(tmp_path.glob("engine-*.pid")).read_text())
    assert process_alive(engine_pid) and os.getpgid(engine_pid) == pgid
    server.stop()
    assert wait_until(lambda: not group_members(pgid), 5)
    assert not process_alive(engine_pid)  # ignored SIGTERM, got SIGKILL
    with pytest.raises(InfrastructureError):
        server.base_url  # noqa: B018


def test_reuse_url_uses_the_running_server(server: VLLMServer, tmp_path: Path) -> None:
    other = VLLMServer(VLLMServerConfig(model="x", served_model_name="fake-model", reuse_url=server.base_url))
    assert other.start() == server.base_url
    assert not other.owned
    other.stop()  # not ours: nothing happens
    assert server.pid is not None and process_alive(server.pid)
    wrong_model = VLLMServerConfig(
        model="x", served_model_name="other", reuse_url=server.base_url, log_path=tmp_path / "other.log"
    )
    with pytest.raises(InfrastructureError, match="exited with code 1"):  # so it started its own
        VLLMServer(wrong_model, command=[sys.executable, "-c", "raise SystemExit(1)"]).start()


def test_state_file_lets_a_second_server_reuse_the_first(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    with fake_server(tmp_path, state_path=state) as first:
        assert json.loads(state.read_text())["base_url"] == first.base_url
        second = fake_server(tmp_path, state_path=state)
        assert second.start() == first.base_url and not second.owned
    assert not state.exists()


def _record(path: Path, config: VLLMServerConfig, base_url: str, pid: int) -> VLLMServerConfig:
    path.write_text(json.dumps({"base_url": base_url, "pid": pid, "launch_key": config.launch_key()}))
    return config.model_copy(update={"state_path": path})


def test_a_record_of_a_live_healthy_server_is_found(server: VLLMServer, tmp_path: Path) -> None:
    assert server.pid is not None
    config = _record(tmp_path / "r.json", server.config, server.base_url, server.pid)
    assert recorded_server(config) == server.base_url


def test_a_record_whose_process_is_gone_is_ignored(server: VLLMServer, tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    config = _record(tmp_path / "r.json", server.config, server.base_url, gone.pid)  # the URL still answers
    assert recorded_server(config) is None


def test_a_record_of_a_server_that_does_not_answer_is_ignored(server: VLLMServer, tmp_path: Path) -> None:
    assert server.pid is not None
    silent = f"http://127.0.0.1:{free_port()}/v1"
    assert recorded_server(_record(tmp_path / "r.json", server.config, silent, server.pid)) is None


def test_a_record_made_with_other_settings_is_ignored(server: VLLMServer, tmp_path: Path) -> None:
    assert server.pid is not None
    config = _record(tmp_path / "r.json", server.config, server.base_url, server.pid)
    assert recorded_server(config.model_copy(update={"max_model_len": 4096})) is None


async def test_async_context_manager(tmp_path: Path) -> None:
    async with fake_server(tmp_path) as server:
        pgid = server.pid
        async with aiohttp.ClientSession() as session, session.get(f"{server.base_url}/models") as resp:
            assert (await resp.json(content_type=None))["data"][0]["id"] == "fake-model"
    assert pgid is not None and wait_until(lambda: not group_members(pgid), 5)


def test_starting_a_server_installs_no_signal_handler(tmp_path: Path) -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with fake_server(tmp_path):
        assert {sig: signal.getsignal(sig) for sig in before} == before


# A process that starts a server, prints its process group id and then waits to be killed.
START_AND_WAIT = r"""
import sys, time
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig
config = VLLMServerConfig.model_validate_json(sys.argv[1])
command = sys.argv[2:] or None
server = VLLMServer(config, command=command)
server.start()
print(server.pid, flush=True)
time.sleep(600)
"""


def kill_parent_and_check_no_orphans(config: VLLMServerConfig, command: list[str], timeout_s: float,
                                     signum: int = signal.SIGKILL) -> None:
    """Start a server from a child process, kill the child with `signum` (it handles none), and require the server's
    group to vanish."""
    parent = subprocess.Popen(
        [sys.executable, "-c", START_AND_WAIT, config.model_dump_json(), *command],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        assert line.strip().isdigit(), f"server did not start: {line!r}"
        pgid = int(line)
        assert len(group_members(pgid)) >= 2
    finally:
        parent.send_signal(signum)
        parent.wait()
    assert wait_until(lambda: not group_members(pgid), timeout_s), f"left behind: {group_members(pgid)}"


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_owner_leaves_no_process_behind(tmp_path: Path, signum: int) -> None:
    """SIGKILL or an unhandled SIGTERM: the owner stops nothing itself, its supervisor sees it gone."""
    port = free_port()
    config = VLLMServerConfig(
        model="x", served_model_name="m", port=port, stop_grace_s=1.0, log_path=tmp_path / "vllm.log"
    )
    command = [sys.executable, "-c", FAKE_VLLM, str(port), "m", str(tmp_path / "engine.pid")]
    kill_parent_and_check_no_orphans(config, command, timeout_s=10, signum=signum)
    assert not process_alive(int((tmp_path / "engine.pid").read_text()))


# --- the real vLLM with the embedded model ---------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_config(tmp_path_factory: pytest.TempPathFactory) -> VLLMServerConfig:
    from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir

    logs = tmp_path_factory.mktemp("vllm")
    return VLLMServerConfig(
        model=str(embedded_model_dir()), served_model_name=SERVED_MODEL_NAME, log_path=logs / "vllm.log"
    )


@pytest.mark.slow
async def test_real_vllm_answers_a_chat_request(embedded_config: VLLMServerConfig) -> None:
    body = {
        "model": embedded_config.name,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16,
        "logprobs": True,
        "return_token_ids": True,
    }
    async with VLLMServer(embedded_config) as server, aiohttp.ClientSession() as session:
        async with session.post(f"{server.base_url}/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            reply = await resp.json()
        pgid = server.pid
    choice = reply["choices"][0]
    assert choice["message"]["content"].strip()
    completion_tokens = reply["usage"]["completion_tokens"]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) == completion_tokens
    assert reply["prompt_token_ids"][:1] == [1]  # <|im_start|>
    assert pgid is not None and wait_until(lambda: not group_members(pgid), 30)


@pytest.mark.slow
def test_real_vllms_engine_core_loads_the_plugin_that_stops_its_queue_spin(embedded_config: VLLMServerConfig) -> None:
    """The `vllm.general_plugins` entry point reaches the engine core, the process that waits on the worker."""
    log_path = embedded_config.log_path.with_name("spin.log")
    with VLLMServer(embedded_config.model_copy(update={"log_path": log_path})):
        log = log_path.read_text()
    said = {line.split("pid ")[1].split(")")[0] for line in log.splitlines() if "readers spin 0.0 s" in line}
    assert len(said) >= 3  # the API server, the engine core and the worker: each its own process


@pytest.mark.slow
def test_killing_the_owner_of_real_vllm_leaves_no_process_behind(embedded_config: VLLMServerConfig) -> None:
    kill_parent_and_check_no_orphans(embedded_config, [], timeout_s=30)
