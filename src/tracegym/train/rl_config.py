"""RL config: one TOML for a whole `tracegym rl` run, with a section per process (orchestrator, trainer) and the
renames that keep older configs working for a release.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_config import BaseConfig

from tracegym.config.command_line import parse_command
from tracegym.config.renames import Rename, moved_into
from tracegym.config.run_dir import RunId
from tracegym.core.cut_policy import CutPolicy
from tracegym.core.errors import UsageError
from tracegym.core.sampling import Sampling
from tracegym.models.client_settings import ClientKind
from tracegym.models.model_choice import ModelChoice
from tracegym.runtimes.watchdog import WatchdogConfig
from tracegym.serve.env_server_choice import EnvServerChoice
from tracegym.train.advantages import AdvantageConfig
from tracegym.train.difficulty import DifficultyConfig
from tracegym.train.distillation import OPDConfig
from tracegym.train.filters import Filters
from tracegym.train.seating import Play, SeatChoice, check_seats, uses_base_weights
from tracegym.train.sft import SFTConfig, check_single_agent
from tracegym.train.tracking import TrackingConfig
from tracegym.train.trainer import TrainerConfig
from tracegym.train.tripwire import TripwireConfig
from tracegym.train.weight_sync import SyncMode, sync_mode

RENAMES = [
    Rename("sampling", "orchestrator.train.sampling"),
    Rename("orchestrator.sampling", "orchestrator.train.sampling"),  # prime-rl's name for it
    Rename("orchestrator.train.sampling.max_completion_tokens", "orchestrator.train.sampling.max_tokens"),
    Rename("orchestrator.eval.sampling.max_completion_tokens", "orchestrator.eval.sampling.max_tokens"),
    *moved_into("model", {"model": "name", "max_model_len": "max_model_len"}),
    Rename("orchestrator.client", "model.client"),
    Rename("orchestrator.renderer", "model.renderer"),
    Rename("orchestrator.std_normalize", "orchestrator.advantage.std"),
    Rename("orchestrator.filter_no_signal", "orchestrator.advantage.filter_no_signal"),
    Rename("orchestrator.advantage", "orchestrator.advantage.name"),  # `advantage = "rae"`: a shorthand, kept
    # prime-rl's spellings: `[[orchestrator.env]]` (older), `[[orchestrator.train.env]]`, `max_steps`,
    # `rollouts_per_example` (an entry's `args` is an alias of `options`: EnvChoice)
    Rename("orchestrator.env", "orchestrator.train.envs"),
    Rename("orchestrator.train.env", "orchestrator.train.envs"),
    Rename("orchestrator.eval.env", "orchestrator.eval.envs"),
    Rename("max_steps", "steps"),
    Rename("orchestrator.rollouts_per_example", "orchestrator.group_size"),
]
"""Keys that moved: each still works, with a warning naming its new place."""


class EnvChoice(EnvServerChoice):
    """One environment the orchestrator samples tasks from, and its env server: one running at `address`, or one
    the launcher starts with the pool options `tracegym eval`'s `[env]` has (`workers`, `elastic`,
    `worker_timeout`, ...: `EnvServerChoice`'s fields, written in this entry beside `id`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    """Taskset id."""
    weight: float = 1.0
    """Share of each step's tasks drawn from this environment (relative to the others)."""
    options: dict[str, Any] = Field(default_factory=dict, validation_alias=AliasChoices("options", "args"))
    """The taskset's own options (its Config fields); `args` (prime-rl's name) is taken too."""
    play: Play = Play()
    """A multi-agent environment: who the learner is in each episode and whom it plays (default: every seat is
    the policy and trains)."""
    seats: dict[str, SeatChoice] = Field(default_factory=dict)
    """A multi-agent environment: members pinned for the whole run, by member id (e.g. `judge = { model =
    "base" }`, or `{ trainable = true }` to train a judge's verdicts)."""
    difficulty: DifficultyConfig | None = None
    """A training environment: online difficulty (tasks whose recent pass rate is outside a band are drawn less;
    groups without signal refilled), e.g. `difficulty = { low = 0.1, high = 0.9, refills = 4 }`; unset: off."""


RL_MAX_TOKENS = 48
"""Most tokens per model call in RL phases unless set (short replies keep a CPU step fast); an eval's is 256."""


def distinct_ids(envs: list[EnvChoice]) -> list[EnvChoice]:
    """A phase names each environment once (its env server and task stream are found by id)."""
    ids = [e.id for e in envs]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ValueError(f"environment {', '.join(map(repr, twice))} is listed more than once; list it once")
    return envs


class TrainPhase(BaseModel):
    """What the policy trains on."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    envs: Annotated[list[EnvChoice], AfterValidator(distinct_ids)] = Field(
        default_factory=lambda: [EnvChoice(id="reverse-text")])
    """Environments and their weights."""
    sampling: Sampling = Sampling(max_tokens=RL_MAX_TOKENS)
    """Sampling of the training rollouts (the `[sampling]` section `tracegym eval` has)."""


class EvalPhase(BaseModel):
    """Held-out evaluation during training."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    envs: Annotated[list[EnvChoice], AfterValidator(distinct_ids)] = Field(default_factory=list)
    """Held-out environments (give other seeds than training); empty: no evaluation."""
    num_tasks: int = 32
    """Tasks per held-out environment."""
    every: int = 5
    """Evaluate before step 0, every N steps, and after the last step; 0: only before and after."""
    sampling: Sampling = Sampling(temperature=0.0, max_tokens=RL_MAX_TOKENS)
    """Sampling of the held-out rollouts (greedy by default)."""

    @field_validator("envs")
    @classmethod
    def _no_difficulty(cls, envs: list[EnvChoice]) -> list[EnvChoice]:
        """Held-out tasks are the same at every evaluation: online difficulty is for training environments."""
        for i, env in enumerate(envs):
            if env.difficulty is not None:
                raise ValueError(f"envs.{i} ({env.id}): `difficulty` applies to training environments only")
        return envs


class OrchestratorConfig(BaseModel):
    """The orchestrator: rollouts, advantages, batches."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tasks_per_step: int = 2
    """Groups (tasks) per training step."""
    group_size: int = 8
    """Rollouts per task; advantages compare rollouts within a group."""
    max_async_steps: int = 1
    """How many steps the orchestrator may run ahead of the trainer (0: on-policy)."""
    concurrency: int = Field(default=64, gt=0)
    """Rollouts in flight at once."""
    advantage: AdvantageConfig = AdvantageConfig()
    """How advantages are computed (`advantage = "rae"` is short for `[orchestrator.advantage] name = "rae"`)."""
    truncated_reward: float | None = None
    """Multi-agent: the reward of every trainable member of an episode cut short (a reply ran into
    `sampling.max_tokens`, or a prompt no longer fit), in place of its payoff; e.g. -1 makes rambling as bad
    as forfeiting (an unfinished game otherwise pays 0, a safe harbour next to a lost one). Unset: the payoff."""
    cuts: CutPolicy = CutPolicy()
    """The reward of a rollout cut short or misread, one rule per kind (`core.cut_policy`): `overlong` (the prompt
    no longer fit the context), `length` (a reply ran into `sampling.max_tokens`), `unparsable` (a reply that did
    not parse into a tool call or move), each `keep` (its scored reward: the default), a number (that reward
    instead: `--orchestrator.cuts.length -1`) or `mask` (out of its group's baseline and the loss, counted as
    `masked/<kind>`). A multi-agent episode cut short as a whole takes `truncated_reward` first, when set."""
    filters: Filters = Filters()
    """Rollout filters, run on every trainable rollout after scoring, a section each with its mode and thresholds:
    `[orchestrator.filters.gibberish] mode = "enforce"` (`detect`, the default, only counts; `off`)."""
    batch_attempts: int = Field(default=10, ge=1)
    """Attempts at each step's batch: a step left with no samples (its rollouts filtered out, failed or in groups
    without signal) is rolled out again with new tasks, up to this many times in all; then the run stops, saying
    what became of the rollouts. (A step whose every rollout failed stops at once: a model or endpoint problem.)"""
    seed: int = 0
    """Seed of the task order."""
    tripwire: TripwireConfig = TripwireConfig()
    """Online signs of a reward hack (`train.tripwire`): `witness = "exact"` arms the scorer-gap wire (a scorer the
    run does not train on); `action = "warn" | "pause" | "stop"` is what a firing does."""
    train: TrainPhase = TrainPhase()
    eval: EvalPhase = EvalPhase()

    @field_validator("advantage", mode="before")
    @classmethod
    def _advantage_by_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _batch_size_in_groups(cls, data: Any) -> Any:
        """prime-rl's `batch_size` (rollouts per step) as `tasks_per_step` groups of `group_size`."""
        if not isinstance(data, dict) or "batch_size" not in data:
            return data
        data = dict(data)
        batch, group = data.pop("batch_size"), data.get("group_size", cls.model_fields["group_size"].default)
        if "tasks_per_step" in data:
            raise ValueError("set tasks_per_step or batch_size (prime-rl's rollouts per step), not both")
        if not isinstance(batch, int) or not isinstance(group, int) or batch <= 0 or group <= 0 or batch % group:
            raise ValueError(f"batch_size = {batch!r} (prime-rl's rollouts per step) must be a positive multiple of "
                             f"group_size ({group!r})")
        return {**data, "tasks_per_step": batch // group}

    @model_validator(mode="after")
    def _refills_need_groups(self) -> OrchestratorConfig:
        """A group of one never has signal: refilling it would only spend the refills."""
        refilling = [e.id for e in self.train.envs if e.difficulty and e.difficulty.refills]
        if refilling and self.group_size < 2:
            raise ValueError(f"{refilling[0]}: difficulty.refills needs group_size >= 2 (a group of one never has "
                             "signal)")
        return self


class SlurmConfig(BaseModel):
    """How a run is laid out on a Slurm allocation (`--cluster slurm`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    job_name: str = "tracegym-rl"
    """The job's name in the queue."""
    partition: str | None = None
    """Partition to run in; unset: the cluster's default."""
    account: str | None = None
    """Account to charge; unset: yours by default."""
    time: str | None = None
    """Wall-clock limit (`HH:MM:SS` or `D-HH:MM:SS`); unset: the partition's."""
    inference_nodes: int = Field(default=1, ge=1)
    """Nodes that each run one vLLM server."""
    env_nodes: int = Field(default=0, ge=0)
    """Nodes for env servers (each env server on one, in turn); 0: they run on the first trainer node."""
    trainer_nodes: int = Field(default=1, ge=1)
    """Nodes that run trainer ranks (`trainer.num_processes` on each)."""
    gpus_per_node: int = Field(default=8, ge=0)
    """GPUs to ask for on every node (0 on a CPU cluster)."""
    setup: list[str] = Field(default_factory=lambda: ["source .venv/bin/activate"])
    """Shell lines every node runs first, in `project_dir` (load modules, activate the environment)."""
    project_dir: Path = Path(".")
    """Where `setup` runs (made absolute when the script is written)."""
    vllm_port: int = 8000
    """Port of the vLLM server on each inference node."""
    env_port: int = 5555
    """Port of the first env server on a host; the next ones count up."""
    master_port: int = 29500
    """Port of the trainer ranks' rendezvous on the first trainer node."""


class RLModel(ModelChoice):
    """The model to train, served by a vLLM server the run starts (new weights are loaded into it), and how the
    orchestrator's rollouts reach it (`base_url` must stay unset)."""

    served_by: ClassVar[str | None] = "tracegym rl"
    client: ClientKind = "tokens"
    """`tokens` (RL's default: the exact multi-turn tokens to train on) or `chat`."""
    max_model_len: int = 1024
    """Context length (prompt + completion) of the run's vLLM server."""


Mode = Literal["rl", "sft", "opd"]
"""What a run optimises (DESIGN.md, Mode): `rl` the rewards of the policy's own rollouts; `sft` cross-entropy on the
teacher's rollouts, re-rendered with the student's renderer; `opd` the teacher's logprobs on the student's own
sampled tokens (on-policy distillation)."""


class TeacherModel(ModelChoice):
    """The teacher of an `sft` run (its rollouts are the training data, through the chat client by default) or an
    `opd` run (it scores the student's tokens): an endpoint already running (`base_url`), or a model directory
    (`name`, e.g. a checkpoint's merged weights) that the run serves with a vLLM server of its own."""

    client: ClientKind = "chat"
    """`chat` (the teacher's text, re-rendered for the student; any OpenAI-compatible endpoint) or `tokens`."""


class RLConfig(BaseConfig):
    """Train a model with RL on tracegym environments."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    mode: Mode = "rl"
    """`rl` (rewards), `sft` (the teacher's rollouts, filtered, as supervised data) or `opd` (on-policy
    distillation: the teacher's logprobs on the student's own tokens); `sft` and `opd` need a `[teacher]`."""
    steps: int = 20
    """Training steps."""
    model: RLModel = RLModel()
    teacher: TeacherModel | None = None
    """The teacher of an `sft` or `opd` run; unused (and refused) in `rl`."""
    sft: SFTConfig = SFTConfig()
    """`sft` runs: which of the teacher's rollouts are trained on (reward threshold, best-of-n per task)."""
    opd: OPDConfig = OPDConfig()
    """On-policy distillation (`mode = "opd"`): the advantage's make-up and who scores the student's tokens."""
    kv_cache_gib: float = Field(default=0.5, gt=0)
    """vLLM's KV cache on the CPU build, in GiB (~23 KB per token for SmolLM2-135M: 0.5 GiB holds ~23k tokens,
    plenty for 32 concurrent rollouts of a few hundred tokens); the GPU build sizes it from GPU memory."""
    output_dir: Path = Path("outputs/rl")
    """Where run folders are created."""
    run_id: RunId | None = None
    """Name of the run folder; unset: the start time."""
    weight_sync: Literal["lora", "merged"] = "lora"
    """How new weights reach vLLM: `lora` loads the adapter in place (requests name it); `merged` has vLLM serve
    the weights with the adapter merged in (requests keep the base name; on CPU generation is ~3x faster than
    through an adapter): vLLM merges each adapter into the base weights it keeps (`models.merge_extension`), or,
    without LoRA, reloads the full weights the trainer writes."""
    checkpoint_every: int = Field(default=5, ge=1)
    """Save a resumable checkpoint every N steps (and after the last)."""
    max_error_rate: float = Field(default=0.5, ge=0, le=1)
    """The command exits 1 when more than this fraction of the run's rollouts (or of its multi-agent episodes)
    failed, over the whole run, as `tracegym eval --max-error-rate` (`train.run_tally`); a step whose every rollout
    failed stops the run at once, whatever this says."""
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    trainer: TrainerConfig
    dry_run: bool = False
    """Print the resolved config of every process and exit."""
    cluster: Literal["local", "slurm"] = "local"
    """`local`: run every process on this machine; `slurm`: write the run folder and the batch script that runs
    them on a Slurm allocation (`sbatch RUN_DIR/rl.sbatch`), laid out as the `slurm` section says, and exit."""
    slurm: SlurmConfig = SlurmConfig()
    tracking: TrackingConfig = TrackingConfig()
    """Where the orchestrator's records go besides `metrics.jsonl`: Weights & Biases, TensorBoard."""
    watchdog: WatchdogConfig = WatchdogConfig()
    """How long each stage of every process may make no progress: named as a warning after
    `--watchdog.warn-after`, the run stopped after the stage's own budget (`--watchdog.weight-sync 900`, ...):
    exit 5, or 6 when only the held-out evaluation after the last step was cancelled (`--watchdog.eval-drain`)."""

    @model_validator(mode="before")
    @classmethod
    def _trainer_model(cls, data: Any) -> Any:
        """The trainer trains the model the run serves unless its section names another."""
        if isinstance(data, dict):
            trainer = dict(data.get("trainer") or {})
            model = data.get("model")
            name = model.get("name") if isinstance(model, dict) else getattr(model, "name", None)
            trainer.setdefault("model", name or "")
            trainer.setdefault("objective", "cross_entropy" if data.get("mode") == "sft" else "policy_gradient")
            data = {**data, "trainer": trainer}
        return data


    @model_validator(mode="after")
    def _teacher_for_mode(self) -> RLConfig:
        """`sft` and `opd` learn from a teacher; `rl` has none, and a `[teacher]` there would be silently unused."""
        if self.mode != "rl" and self.teacher is None:
            raise ValueError(f"mode = {self.mode!r} learns from a teacher: add a [teacher] section (`base_url` of "
                             "an OpenAI-compatible endpoint, or `name` of a model directory to serve)")
        if self.mode == "rl" and self.teacher is not None:
            raise ValueError("[teacher] is used by mode = 'sft' or 'opd' only; remove it or set `mode`")
        if (self.trainer.objective == "cross_entropy") != (self.mode == "sft"):
            raise ValueError(f"trainer.objective = {self.trainer.objective!r} does not fit mode = {self.mode!r}; "
                             "leave it unset (the mode sets it)")
        return self

    @model_validator(mode="after")
    def _weight_sync_fits_trainer(self) -> RLConfig:
        """`weight_sync` and `trainer.lora` make a `SyncMode`."""
        try:
            sync_mode(self.weight_sync, self.trainer.lora)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _base_model_served(self) -> RLConfig:
        """An opponent or seat playing as the base model or a past checkpoint needs the base weights kept in vLLM."""
        phases = {"train": self.orchestrator.train.envs, "eval": self.orchestrator.eval.envs}
        loads_adapters = sync_mode(self.weight_sync, self.trainer.lora) is SyncMode.LOAD_ADAPTER
        for phase, envs in phases.items():
            for i, env in enumerate(envs):
                if uses_base_weights(env.play, env.seats) and not loads_adapters:
                    raise ValueError(f"orchestrator.{phase}.envs.{i} ({env.id}) plays the base model or past "
                                     "checkpoints: that needs weight_sync = 'lora' and trainer.lora (merged weights "
                                     "replace the base model in vLLM)")
        return self


def lora_slots(orchestrator: OrchestratorConfig) -> int:
    """Adapters vLLM must hold at once: the policy's, and the opponent pool's (the largest `pool_latest`)."""
    envs = [*orchestrator.train.envs, *orchestrator.eval.envs]
    return 1 + max((e.play.pool_latest for e in envs if e.play.opponent == "pool"), default=0)


def env_server_key(env: EnvChoice, held_out: bool) -> str:
    """The name of an environment's env server: its id for training, `eval:<id>` for held-out evaluation."""
    return f"eval:{env.id}" if held_out else env.id


def env_servers(orchestrator: OrchestratorConfig) -> dict[str, EnvChoice]:
    """Every env server a run uses, by name: one per train environment and one per held-out one, even when
    they share an id (the held-out one usually runs other options, e.g. another seed)."""
    return {**{env_server_key(e, held_out=False): e for e in orchestrator.train.envs},
            **{env_server_key(e, held_out=True): e for e in orchestrator.eval.envs}}


def trainer_nodes(cluster: Literal["local", "slurm"], slurm: SlurmConfig) -> int:
    """How many machines run trainer ranks (`trainer.num_processes` on each): `slurm.trainer_nodes` on Slurm,
    else this one."""
    return slurm.trainer_nodes if cluster == "slurm" else 1


def parse_rl_args(args: list[str]) -> tuple[RLConfig, list[str]]:
    """The validated config and the warnings (renamed keys; seating not checked here); more trainer ranks than a
    step has rollouts (some would have nothing to train), a seat a multi-agent taskset has not, or SFT on a
    multi-agent taskset, is a UsageError naming the flag."""
    config, warnings = parse_command(RLConfig, args, prog="tracegym rl", renames=RENAMES)
    phases = {"train": config.orchestrator.train.envs, "eval": config.orchestrator.eval.envs}
    for phase, envs in phases.items():
        for i, env in enumerate(envs):
            if said := check_seats(f"--orchestrator.{phase}.envs.{i}", env.id, env.options, env.play, env.seats):
                warnings.append(said)
    if config.mode == "sft":
        for i, env in enumerate(config.orchestrator.train.envs):
            if said := check_single_agent(f"--orchestrator.train.envs.{i}", env.id, env.options):
                warnings.append(said)
    ranks = config.trainer.num_processes * trainer_nodes(config.cluster, config.slurm)
    rollouts = config.orchestrator.tasks_per_step * config.orchestrator.group_size
    if ranks > rollouts:
        raise UsageError(f"--trainer.num-processes: {ranks} trainer ranks, but a step has only {rollouts} rollouts "
                         f"to share among them (orchestrator.tasks-per-step x group-size); use at most {rollouts}")
    return config, warnings
