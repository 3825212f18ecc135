"""Weight sync: loads each new LoRA adapter into a running vLLM in place and tracks the policy version it serves.

vLLM must run with LoRA enabled and runtime updating allowed (`VLLMServerConfig(enable_lora=True)` sets
`VLLM_ALLOW_RUNTIME_LORA_UPDATING`). `publish(adapter_dir, version)` posts `/v1/load_lora_adapter` with
`load_inplace`, so the adapter keeps its name (`model_name`, what requests put in `model`) and requests that
arrive after the call returns are served by the new weights. Each version is served from its own snapshot
folder (`<adapter_dir>.v<version>`): vLLM's prefix cache keys blocks by adapter name *and path*, so reloading
one path in place would let new requests reuse prompt KV computed by the old adapter; a fresh path per version
makes that impossible, and the caller may keep overwriting one folder. The last `keep` snapshots stay on disk:
a request sent before a publish still names the older path, and vLLM reloads an adapter from its path when it
schedules such a request again; a missing folder there kills vLLM's engine. HTTP goes through the transport
(`models.transport`), one attempt per route: a refusal (4xx: runtime loading off, rank above `max_lora_rank`, bad
files) is a UsageError, an unreachable or failing server (5xx) an InfrastructureError.

>>> sync = WeightSync(server.base_url, adapter_name="policy")  # doctest: +SKIP
>>> sync.publish(trainer.save_weights(run_dir / "adapters" / "step_1"), version=trainer.version)  # doctest: +SKIP
>>> Endpoint(base_url=server.base_url, model=sync.model_name)  # doctest: +SKIP
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from tracegym.core.errors import ModelError, UsageError
from tracegym.models import policy_version, transport

DEFAULT_ADAPTER_NAME = "policy"
LORA_NEEDS = "vLLM started with LoRA enabled and runtime LoRA updating (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"


class WeightSync:
    """Publishes adapters to one vLLM server under one name; `version` is the policy version it serves."""

    def __init__(self, base_url: str, adapter_name: str = DEFAULT_ADAPTER_NAME, timeout_s: float = 120.0,
                 keep: int = 4, announce: bool = False) -> None:
        """`announce`: after each publish, tell the server which version it now serves (a vLLM started with
        `report_policy_version`), so every response says which policy served it."""
        if keep < 1:
            raise UsageError(f"keep must be at least 1 snapshot, got {keep}")
        self.base_url = base_url.rstrip("/")
        self.root = self.base_url.removesuffix("/v1")
        self.announce = announce
        self.adapter_name = adapter_name
        self.timeout_s, self.keep = timeout_s, keep
        self._snapshots: list[Path] = []
        self.version: int | None = None
        """The policy version vLLM serves under `model_name` (None before the first publish)."""
        self.last_seconds = 0.0
        """How long the last publish took."""
        self.served_path: Path | None = None
        """The snapshot folder vLLM serves the current version from."""

    @property
    def model_name(self) -> str:
        """The `model` requests must name to be served by the current adapter."""
        return self.adapter_name

    def publish(self, adapter_dir: str | Path, version: int) -> str:
        """Load the adapter in `adapter_dir` in place of the served one; afterwards `version` is served under
        the returned name (`model_name`)."""
        path = Path(adapter_dir).resolve()
        if not (path / "adapter_config.json").is_file():
            raise UsageError(f"{path} is not a LoRA adapter directory (no adapter_config.json)")
        start = time.perf_counter()
        snapshot = path.with_name(f"{path.name}.v{version:06d}")
        if snapshot != self.served_path:
            shutil.rmtree(snapshot, ignore_errors=True)
            shutil.copytree(path, snapshot)
        body = {"lora_name": self.adapter_name, "lora_path": str(snapshot), "load_inplace": True}
        self._post("/load_lora_adapter", body)
        self._announce(version)
        self.served_path, self.version = snapshot, version
        self._snapshots = [p for p in self._snapshots if p != snapshot] + [snapshot]
        for old in self._snapshots[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        self._snapshots = self._snapshots[-self.keep:]
        self.last_seconds = time.perf_counter() - start
        return self.model_name

    def _announce(self, version: int) -> None:
        if self.announce:
            self._post(policy_version.ROUTE, {"version": version}, base=self.root, what=f"policy version {version}",
                       needs=f"vLLM started with report_policy_version (--middleware {policy_version.MIDDLEWARE})")

    def _post(self, route: str, body: dict[str, object], base: str | None = None, what: str = "",
              needs: str = LORA_NEEDS) -> str:
        """POST JSON to `base_url + route` (or `base + route`) once, through the transport (no reply or a 5xx is
        its InfrastructureError); a refusal (4xx) is the user's setup, so a UsageError: a missing `route` says
        what the server `needs`, any other names `what` the request carried."""
        url = (base or self.base_url) + route
        try:
            return transport.call(url, body, timeout=self.timeout_s)
        except ModelError as exc:  # a 4xx: Refused, or a 400 whose wording reads as a context overflow
            status, detail = (exc.status, exc.detail) if isinstance(exc, transport.Refused) else (400, str(exc))
            if status == 404:
                raise UsageError(f"{url} not found: this needs {needs} ({detail})") from None
            what = what or f"adapter {self.adapter_name!r}"
            raise UsageError(f"vLLM refused {what} (HTTP {status}): {detail}") from None


class MergedWeightSync(WeightSync):
    """Publishes merged full weights: vLLM reloads its base weights in place from a folder written by
    `Trainer.save_merged`, and its prefix cache is reset, so requests keep naming the base model. Needs vLLM
    started with `VLLM_SERVER_DEV_MODE=1` (its `/collective_rpc` and `/reset_prefix_cache` routes). On a CPU,
    generating through plain weights is ~3x faster than through a LoRA adapter, which pays for the reload."""

    def __init__(self, base_url: str, model_name: str, timeout_s: float = 120.0, announce: bool = False) -> None:
        super().__init__(base_url, adapter_name=model_name, timeout_s=timeout_s, announce=announce)

    def publish(self, weights_dir: str | Path, version: int) -> str:
        path = Path(weights_dir).resolve()
        if not (path / "model.safetensors").is_file():
            raise UsageError(f"{path} holds no merged weights (model.safetensors); see Trainer.save_merged")
        start = time.perf_counter()
        self._post_root("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
        self._post_root("/reset_prefix_cache", {})
        self._announce(version)
        self.served_path, self.version = path, version
        self.last_seconds = time.perf_counter() - start
        return self.model_name

    def _post_root(self, route: str, body: dict[str, object]) -> str:
        return self._post(route, body, base=self.root, what="the merged weights",
                          needs="vLLM started with VLLM_SERVER_DEV_MODE=1 (merged weight sync)")

