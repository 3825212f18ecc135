"""Weight sync: loads each new LoRA adapter into the running vLLM servers in place; tracks the version each serves.

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

Several servers (a list of base URLs): each publish reaches every one (at once; the snapshot folder is one path
they all read, so it must be on storage every server sees) and each server is told its version only after its
own load succeeded, so the version each response carries is the one that server serves. A server that cannot be
reached keeps its older weights and version (`versions`) and is named in a warning; the run goes on with the
others, each of its responses still stamped with the version it really served (so the staleness check holds per
server), and the next publish brings it up to date. Every server failing is the InfrastructureError above.

>>> sync = WeightSync(server.base_url, adapter_name="policy")  # doctest: +SKIP
>>> sync.publish(trainer.save_weights(run_dir / "adapters" / "step_1"), version=trainer.version)  # doctest: +SKIP
>>> Endpoint(base_url=server.base_url, model=sync.model_name)  # doctest: +SKIP

How a run's weights travel is one `SyncMode`, decided once from its `weight_sync` and `trainer.lora`
(`sync_mode`): it says how vLLM starts (`SyncMode.vllm_config`), which WeightSync the trainer publishes through
(`build_weight_sync`) and whether the trainer writes merged weights (`merged`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Literal

from tracegym.core.errors import InfrastructureError, ModelError, UsageError
from tracegym.models import policy_version, transport
from tracegym.models.vllm_server import VLLMServerConfig

log = logging.getLogger(__name__)

DEFAULT_ADAPTER_NAME = "policy"
RESET_ROUTE = "/reset_prefix_cache?reset_running_requests=true"
LORA_NEEDS = "vLLM started with LoRA enabled and runtime LoRA updating (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"


class SyncMode(StrEnum):
    """How the trainer's new weights reach vLLM."""

    LOAD_ADAPTER = "load_adapter"
    """`weight_sync = "lora"`: vLLM loads each LoRA adapter at run time (`WeightSync`); requests name it."""
    MERGE_ADAPTER = "merge_adapter"
    """`weight_sync = "merged"` with LoRA: vLLM merges each adapter into the base weights it keeps (its merge
    extension, `MergedWeightSync`); requests keep the base model's name."""
    RELOAD_WEIGHTS = "reload_weights"
    """`weight_sync = "merged"`, full weights: vLLM reloads the weights the trainer changed (`MergedWeightSync`)."""

    @property
    def merged(self) -> bool:
        """vLLM serves merged weights, so the trainer also writes them whole at each checkpoint (servable on
        their own, e.g. as a teacher)."""
        return self is not SyncMode.LOAD_ADAPTER

    def vllm_config(self, served: VLLMServerConfig) -> VLLMServerConfig:
        """`served` as this mode needs vLLM started: with runtime LoRA loading, or with vLLM's dev-mode routes (and,
        for adapters, the merge extension); the variables in its `env` are kept."""
        lora = self is SyncMode.LOAD_ADAPTER
        env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} if lora else {"VLLM_SERVER_DEV_MODE": "1"}
        return served.model_copy(update={"enable_lora": lora, "merge_adapters": self is SyncMode.MERGE_ADAPTER,
                                         "env": env | served.env})


def sync_mode(weight_sync: Literal["lora", "merged"], lora: bool) -> SyncMode:
    """The mode of a run's `weight_sync` and `trainer.lora`; a UsageError for adapters without LoRA (a full
    fine-tune has none: its first publish would fail, after every process had started)."""
    if weight_sync == "merged":
        return SyncMode.MERGE_ADAPTER if lora else SyncMode.RELOAD_WEIGHTS
    if not lora:
        raise UsageError("weight_sync = 'lora' loads the trainer's LoRA adapter into vLLM, but trainer.lora = false "
                         "trains full weights: set weight_sync = 'merged' (vLLM reloads them in place)")
    return SyncMode.LOAD_ADAPTER


def build_weight_sync(mode: SyncMode, servers: Sequence[str], served_model: str, base_model: str) -> WeightSync:
    """What the trainer publishes through in `mode` to `servers` (announcing each version): the policy adapter
    under its own name, or merged weights under `served_model` (an adapter merged into `base_model`'s folder)."""
    if mode.merged:  # only rank 0 publishes (TrainerLoop.serve_weights)
        return MergedWeightSync(servers, served_model, base_model, announce=True)
    return WeightSync(servers, adapter_name=DEFAULT_ADAPTER_NAME, announce=True)


class WeightSync:
    """Publishes adapters to vLLM servers under one name; `version` is the policy version published last."""

    def __init__(self, base_url: str | Sequence[str], adapter_name: str = DEFAULT_ADAPTER_NAME,
                 timeout_s: float = 120.0, keep: int = 4, announce: bool = False) -> None:
        """`base_url`: one server's API root, or several; `announce`: after each publish, tell each server which
        version it now serves (a vLLM started with `report_policy_version`), so every response says which policy
        served it."""
        if keep < 1:
            raise UsageError(f"keep must be at least 1 snapshot, got {keep}")
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise UsageError("weight sync needs at least one server")
        self.servers = [url.rstrip("/") for url in urls]
        """Every server's API root (`http://host:port/v1`)."""
        self.base_url = self.servers[0]
        self.announce = announce
        self.adapter_name = adapter_name
        self.timeout_s, self.keep = timeout_s, keep
        self._snapshots: list[Path] = []
        self.version: int | None = None
        """The policy version published last, served under `model_name` (None before the first publish)."""
        self.versions: dict[str, int | None] = dict.fromkeys(self.servers)
        """The version each server serves (older than `version` for one a publish could not reach)."""
        self.last_seconds = 0.0
        """How long the last publish took."""
        self.served_path: Path | None = None
        """The snapshot folder the servers serve the current version from."""

    @property
    def model_name(self) -> str:
        """The `model` requests must name to be served by the current adapter."""
        return self.adapter_name

    def publish(self, adapter_dir: str | Path, version: int) -> str:
        """Load the adapter in `adapter_dir` in place of the served one on every server; afterwards `version` is
        served under the returned name (`model_name`)."""
        path = Path(adapter_dir).resolve()
        if not (path / "adapter_config.json").is_file():
            raise UsageError(f"{path} is not a LoRA adapter directory (no adapter_config.json)")
        start = time.perf_counter()
        snapshot = path.with_name(f"{path.name}.v{version:06d}")
        if snapshot != self.served_path:
            shutil.rmtree(snapshot, ignore_errors=True)
            shutil.copytree(path, snapshot)
        body = {"lora_name": self.adapter_name, "lora_path": str(snapshot), "load_inplace": True}
        self._to_each(lambda url: self._post(url, "/load_lora_adapter", body), version)
        self.served_path, self.version = snapshot, version
        self._snapshots = [p for p in self._snapshots if p != snapshot] + [snapshot]
        for old in self._snapshots[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        self._snapshots = self._snapshots[-self.keep:]
        self.last_seconds = time.perf_counter() - start
        return self.model_name

    def _to_each(self, load: Callable[[str], object], version: int) -> None:
        """`load` on every server at once, then (with `announce`) `version` to each that loaded it. A refusal is
        raised; a server that failed otherwise keeps its older version, with a warning, unless every one failed
        (the first failure is raised)."""

        def one(url: str) -> None:
            load(url)
            self._announce(url, version)
            self.versions[url] = version

        with concurrent.futures.ThreadPoolExecutor(len(self.servers)) as pool:
            outcomes = list(pool.map(_outcome(one), self.servers))
        failures = [(url, exc) for url, exc in zip(self.servers, outcomes, strict=True) if exc is not None]
        refused = [exc for _, exc in failures if not isinstance(exc, InfrastructureError)]
        if refused or len(failures) == len(self.servers):
            raise (refused or [failures[0][1]])[0]
        for url, exc in failures:
            log.warning("policy version %d did not reach %s (it serves version %s until a publish does): %s",
                        version, url, self.versions[url], exc)

    def _announce(self, url: str, version: int) -> None:
        if self.announce:
            self._post(_root(url), policy_version.ROUTE, {"version": version}, what=f"policy version {version}",
                       needs=f"vLLM started with report_policy_version (--middleware {policy_version.MIDDLEWARE})")

    def _post(self, base: str, route: str, body: dict[str, object], what: str = "", needs: str = LORA_NEEDS) -> str:
        """POST JSON to `base + route` once, through the transport (no reply or a 5xx is its InfrastructureError);
        a refusal (4xx) is the user's setup, so a UsageError: a missing `route` says what the server `needs`, any
        other names `what` the request carried."""
        url = base + route
        try:
            return transport.call(url, body, timeout=self.timeout_s)
        except ModelError as exc:  # a 4xx: Refused, or a 400 whose wording reads as a context overflow
            status, detail = (exc.status, exc.detail) if isinstance(exc, transport.Refused) else (400, str(exc))
            if status == 404:
                raise UsageError(f"{url} not found: this needs {needs} ({detail})") from None
            what = what or f"adapter {self.adapter_name!r}"
            raise UsageError(f"vLLM refused {what} (HTTP {status}): {detail}") from None


class MergedWeightSync(WeightSync):
    """Publishes merged full weights, so requests keep naming the base model and each vLLM server's prefix cache
    is reset. What `publish` is handed decides how they get there:
    - a LoRA adapter folder (`Trainer.save_weights`): each server merges it into the base weights it keeps
      (`models.merge_extension`; vLLM started with `merge_adapters`, from the trainer's base `base_model`);
    - a full-weights folder (`Trainer.save_merged`): each server reloads its weights from it in place. It may hold
      only some weights (`changed_only=True`: all but the frozen embeddings); vLLM keeps the rest it holds.
    Both go through vLLM's dev-mode routes (`VLLM_SERVER_DEV_MODE=1`: `/collective_rpc`, `/reset_prefix_cache`).
    No request after a publish reuses prompt KV of the old weights: with `announce` each request's KV is salted
    with its version; without, the prefix cache is reset, preempting running requests.
    On a CPU, generating through plain weights is ~3x faster than through a LoRA adapter, which pays for the
    merge. For SmolLM2-135M a merge in vLLM takes ~0.25 s a step (the trainer rewrites its 19 MB adapter in
    0.04 s; vLLM merges and re-packs its layers in 0.21 s) against 0.5-0.6 s through a file of the merged weights
    (`benchmarks/weight_sync.py`)."""

    def __init__(self, base_url: str | Sequence[str], model_name: str, base_model: str | Path | None = None,
                 timeout_s: float = 120.0, announce: bool = False) -> None:
        """`base_model`: the folder of the weights the trainer's adapter is trained on (what vLLM serves),
        needed to publish adapters."""
        super().__init__(base_url, adapter_name=model_name, timeout_s=timeout_s, announce=announce)
        self.base_model = None if base_model is None else str(Path(base_model).resolve())

    def publish(self, weights_dir: str | Path, version: int) -> str:
        path = Path(weights_dir).resolve()
        rpc = self._merge(path) if (path / "adapter_config.json").is_file() else self._reload(path)
        start = time.perf_counter()

        def load(url: str) -> None:
            self._post_root(url, "/collective_rpc", rpc)
            if not self.announce:  # an announced version salts the prompt KV of requests after it instead
                self._reset_prefix_cache(url)

        self._to_each(load, version)
        self.served_path, self.version = path, version
        self.last_seconds = time.perf_counter() - start
        return self.model_name

    def _merge(self, adapter: Path) -> dict[str, object]:
        if self.base_model is None:
            raise UsageError(f"{adapter} is a LoRA adapter: merging it in vLLM needs the base model's folder "
                             f"(MergedWeightSync(base_model=...))")
        return {"method": "merge_adapter", "kwargs": {"adapter_path": str(adapter), "base_path": self.base_model}}

    def _reload(self, weights: Path) -> dict[str, object]:
        if not (weights / "model.safetensors").is_file():
            raise UsageError(f"{weights} holds neither a LoRA adapter (adapter_config.json) nor merged weights "
                             f"(model.safetensors); see Trainer.save_weights / save_merged")
        return {"method": "reload_weights", "kwargs": {"weights_path": str(weights)}}

    def _reset_prefix_cache(self, url: str) -> None:
        """Drop every KV block the old weights computed. vLLM resets only when no running request holds blocks,
        so running requests are preempted: they go on under the new weights once their prompt and the tokens
        sampled so far are recomputed (each token keeps the logprob it was sampled with). That recompute made an
        overlapped `tracegym rl` step 3 s slower on a CPU, so runs that announce versions skip the reset: vLLM's
        middleware salts each request's prompt KV with the version it arrived at (`policy_version`)."""
        reply = self._post_root(url, RESET_ROUTE, {})
        if transport.json_object(_root(url) + RESET_ROUTE, reply).get("success") is not True:
            raise InfrastructureError(f"{_root(url)} took the new weights but did not reset its prefix cache "
                                      f"(it answered {reply.strip()!r}), so it could serve KV of the old ones")

    def _post_root(self, url: str, route: str, body: dict[str, object]) -> str:
        return self._post(_root(url), route, body, what="the merged weights",
                          needs="vLLM started with VLLM_SERVER_DEV_MODE=1 (merged weight sync)")


def _root(url: str) -> str:
    """A server's root (its routes beside `/v1`)."""
    return url.removesuffix("/v1")


def _outcome(call: Callable[[str], None]) -> Callable[[str], Exception | None]:
    """`call` with its exception returned instead of raised (None: it succeeded)."""

    def run(url: str) -> Exception | None:
        try:
            call(url)
        except Exception as exc:  # the caller sorts each server's failure: refusal, unreachable, failing
            return exc
        return None

    return run
