"""Weight sync against a fake vLLM LoRA endpoint: the request it sends, the version it tracks, translated errors."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tracegym.core.errors import InfrastructureError, UsageError
from tracegym.models import policy_version
from tracegym.models.vllm_server import VLLMServerConfig
from tracegym.train.weight_sync import MergedWeightSync, SyncMode, WeightSync, build_weight_sync, sync_mode

RESET = "/reset_prefix_cache?reset_running_requests=true"


class FakeLoraServer:
    """An HTTP server answering `POST /v1/load_lora_adapter` with `status` and recording each body."""

    def __init__(self, status: int = 200, reply: str = "Success", middleware: bool = True,
                 reset_reply: str = '{"success":true}') -> None:
        """`middleware`: also answer tracegym's policy-version route, as vLLM with `report_policy_version`;
        `reset_reply`: what `/reset_prefix_cache` answers."""
        self.status, self.reply, self.reset_reply, self.bodies = status, reply, reset_reply, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                fake.bodies.append((self.path, json.loads(self.rfile.read(length))))
                known = ("/v1/load_lora_adapter", "/collective_rpc", "/reset_prefix_cache")
                known += (policy_version.ROUTE,) if middleware else ()
                status = fake.status if self.path.partition("?")[0] in known else 404
                self.send_response(status)
                self.end_headers()
                reset = self.path.startswith("/reset_prefix_cache") and status == 200
                self.wfile.write((fake.reset_reply if reset else fake.reply).encode())

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "FakeLoraServer":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def adapter(tmp_path):
    path = tmp_path / "current"
    path.mkdir()
    (path / "adapter_config.json").write_text("{}")
    return path


def test_publish_loads_a_snapshot_of_the_adapter_in_place_under_its_name(adapter):
    with FakeLoraServer() as fake:
        WeightSync(fake.base_url, adapter_name="policy").publish(adapter, version=3)
    snapshot = adapter.resolve().with_name("current.v000003")
    assert fake.bodies == [("/v1/load_lora_adapter",
                            {"lora_name": "policy", "lora_path": str(snapshot), "load_inplace": True})]
    assert (snapshot / "adapter_config.json").is_file()


def test_each_version_is_served_from_a_new_path_and_only_the_last_snapshots_are_kept(adapter):
    with FakeLoraServer() as fake:
        sync = WeightSync(fake.base_url, keep=2)
        for version in (1, 2, 3):
            sync.publish(adapter, version=version)
    paths = [body["lora_path"] for _, body in fake.bodies]
    assert len(set(paths)) == 3
    assert sorted(p.name for p in adapter.parent.iterdir()) == ["current", "current.v000002", "current.v000003"]


def test_the_snapshot_before_the_current_one_survives_a_publish(adapter):
    """Requests sent before a publish still name it, and vLLM may reload it from disk to serve them."""
    with FakeLoraServer() as fake:
        sync = WeightSync(fake.base_url)
        sync.publish(adapter, version=1)
        sync.publish(adapter, version=2)
    assert (adapter.parent / "current.v000001" / "adapter_config.json").is_file()


def test_publish_records_the_served_version_and_requests_name_the_adapter(adapter):
    with FakeLoraServer() as fake:
        sync = WeightSync(fake.base_url, adapter_name="policy")
        assert sync.version is None
        sync.publish(adapter, version=1)
        name = sync.publish(adapter, version=2)
    assert (sync.version, sync.model_name, name) == (2, "policy", "policy")


def test_a_folder_without_an_adapter_is_a_usage_error(tmp_path):
    # tmp_path holds no adapter_config.json
    with pytest.raises(UsageError, match=r"adapter_config\.json"):
        WeightSync("http://127.0.0.1:9/v1").publish(tmp_path, version=1)


def test_a_refused_adapter_is_a_usage_error_quoting_vllm(adapter):
    body = json.dumps({"error": {"message": "rank 32 > max_lora_rank 16"}})
    with FakeLoraServer(400, body) as fake, pytest.raises(UsageError, match="max_lora_rank"):
        WeightSync(fake.base_url).publish(adapter, version=1)


def test_a_server_without_runtime_lora_loading_is_a_usage_error_with_a_hint(adapter):
    with FakeLoraServer(404, "Not Found") as fake, pytest.raises(UsageError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        WeightSync(fake.base_url).publish(adapter, version=1)


def test_a_failing_server_is_an_infrastructure_error_and_the_version_stays(adapter):
    with FakeLoraServer(500, "boom") as fake:
        sync = WeightSync(fake.base_url)
        with pytest.raises(InfrastructureError):
            sync.publish(adapter, version=1)
    assert sync.version is None


def test_an_unreachable_server_is_an_infrastructure_error(adapter):
    with FakeLoraServer() as fake:
        url = fake.base_url
    with pytest.raises(InfrastructureError, match="unreachable"):
        WeightSync(url, timeout_s=2).publish(adapter, version=1)


def test_merged_weights_are_reloaded_in_place_and_the_prefix_cache_reset(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with FakeLoraServer() as fake:
        name = MergedWeightSync(fake.base_url, "base").publish(tmp_path, version=2)
    assert name == "base"
    assert fake.bodies == [("/collective_rpc", {"method": "reload_weights",
                                                "kwargs": {"weights_path": str(tmp_path.resolve())}}),
                           (RESET, {})]


def test_an_adapter_is_merged_by_each_server_into_the_base_it_names(adapter, tmp_path):
    with FakeLoraServer() as fake:
        MergedWeightSync(fake.base_url, "base", base_model=tmp_path).publish(adapter, version=3)
    assert fake.bodies == [("/collective_rpc", {"method": "merge_adapter",
                                                "kwargs": {"adapter_path": str(adapter.resolve()),
                                                           "base_path": str(tmp_path.resolve())}}),
                           (RESET, {})]


def test_a_prefix_cache_the_server_did_not_reset_fails_the_publish_and_keeps_the_version(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with FakeLoraServer(reset_reply='{"success":false}') as fake:
        sync = MergedWeightSync(fake.base_url, "base")
        with pytest.raises(InfrastructureError, match="did not reset its prefix cache"):
            sync.publish(tmp_path, version=2)
    assert sync.versions[fake.base_url] is None


def test_an_adapter_without_a_base_model_is_a_usage_error(adapter):
    with FakeLoraServer() as fake, pytest.raises(UsageError, match="base model"):
        MergedWeightSync(fake.base_url, "base").publish(adapter, version=1)
    assert fake.bodies == []


def test_a_folder_of_neither_adapter_nor_weights_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="neither a LoRA adapter"):
        MergedWeightSync("http://127.0.0.1:9/v1", "base").publish(tmp_path, version=1)


def test_merged_sync_without_dev_mode_says_how_to_enable_it(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with FakeLoraServer(status=404) as fake, pytest.raises(UsageError, match="VLLM_SERVER_DEV_MODE=1"):
        MergedWeightSync(fake.base_url, "base").publish(tmp_path, version=1)


def test_an_announcing_sync_tells_the_server_each_version_after_loading_it(adapter, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with FakeLoraServer() as fake:
        WeightSync(fake.base_url, announce=True).publish(adapter, version=1)
        MergedWeightSync(fake.base_url, "base", announce=True).publish(tmp_path, version=2)
    announced = [(path, body) for path, body in fake.bodies if path == policy_version.ROUTE]
    assert announced == [(policy_version.ROUTE, {"version": 1}), (policy_version.ROUTE, {"version": 2})]
    assert fake.bodies.index(announced[0]) == 1  # after the adapter was loaded, before the next publish


def test_an_announcing_merged_sync_leaves_the_prefix_cache_to_the_version_salt(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with FakeLoraServer(reset_reply='{"success":false}') as fake:
        MergedWeightSync(fake.base_url, "base", announce=True).publish(tmp_path, version=2)
    assert [path for path, _ in fake.bodies] == ["/collective_rpc", policy_version.ROUTE]


def test_announcing_to_a_server_without_the_middleware_says_how_to_start_it(adapter):
    with FakeLoraServer(middleware=False) as fake, pytest.raises(UsageError, match="report_policy_version"):
        WeightSync(fake.base_url, announce=True).publish(adapter, version=1)


def test_a_publish_reaches_every_server_and_each_is_told_its_own_version(adapter):
    with FakeLoraServer() as a, FakeLoraServer() as b:
        sync = WeightSync([a.base_url, b.base_url], announce=True)
        sync.publish(adapter, version=1)
    for fake in (a, b):
        assert [path for path, _ in fake.bodies] == ["/v1/load_lora_adapter", policy_version.ROUTE]
    assert sync.versions == {a.base_url: 1, b.base_url: 1}


def test_a_server_a_publish_cannot_reach_keeps_its_version_and_catches_up_at_the_next(adapter, caplog):
    with FakeLoraServer() as a, FakeLoraServer(500, "boom") as b:
        sync = WeightSync([a.base_url, b.base_url], announce=True)
        sync.publish(adapter, version=1)  # b is down: a warning, not a failure
        assert sync.versions == {a.base_url: 1, b.base_url: None} and sync.version == 1
        assert f"did not reach {b.base_url}" in caplog.text
        assert [path for path, _ in b.bodies] == ["/v1/load_lora_adapter"]  # never told a version it lacks
        b.status = 200
        sync.publish(adapter, version=2)
    assert sync.versions == {a.base_url: 2, b.base_url: 2}


def test_every_server_failing_or_one_refusing_fails_the_publish(adapter, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with FakeLoraServer(500) as a, FakeLoraServer(500) as b, pytest.raises(InfrastructureError):
        MergedWeightSync([a.base_url, b.base_url], "base").publish(tmp_path, version=1)
    with FakeLoraServer() as a, FakeLoraServer(400, "bad rank") as b, pytest.raises(UsageError, match="bad rank"):
        WeightSync([a.base_url, b.base_url]).publish(adapter, version=1)


@pytest.mark.parametrize(("weight_sync", "lora", "mode"), [
    ("lora", True, SyncMode.LOAD_ADAPTER), ("merged", True, SyncMode.MERGE_ADAPTER),
    ("merged", False, SyncMode.RELOAD_WEIGHTS)])
def test_the_sync_mode_of_each_weight_sync_and_trainer(weight_sync, lora, mode):
    assert sync_mode(weight_sync, lora) is mode
    assert mode.merged == (weight_sync == "merged")


def test_adapters_without_lora_are_no_sync_mode():
    with pytest.raises(UsageError, match=r"trainer\.lora = false"):
        sync_mode("lora", False)


@pytest.mark.parametrize(("mode", "lora", "merge", "env"), [
    (SyncMode.LOAD_ADAPTER, True, False, "VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
    (SyncMode.MERGE_ADAPTER, False, True, "VLLM_SERVER_DEV_MODE"),
    (SyncMode.RELOAD_WEIGHTS, False, False, "VLLM_SERVER_DEV_MODE")])
def test_each_mode_starts_vllm_as_it_needs_and_keeps_its_env(mode, lora, merge, env):
    served = mode.vllm_config(VLLMServerConfig(model="/m", env={"LD_PRELOAD": "libtcmalloc.so"}))
    assert (served.enable_lora, served.merge_adapters) == (lora, merge)
    assert list(served.env) == [env, "LD_PRELOAD"]


def test_the_trainer_publishes_an_adapter_by_name_or_merged_weights_under_the_served_name():
    loads = build_weight_sync(SyncMode.LOAD_ADAPTER, ["http://a/v1", "http://b/v1"], "base", "/weights")
    assert type(loads) is WeightSync and loads.model_name == "policy" and loads.announce
    assert len(loads.servers) == 2
    for mode in (SyncMode.MERGE_ADAPTER, SyncMode.RELOAD_WEIGHTS):
        merges = build_weight_sync(mode, ["http://a/v1"], "base", "/weights")
        assert isinstance(merges, MergedWeightSync) and merges.model_name == "base" and merges.announce
        assert merges.base_model == "/weights"
