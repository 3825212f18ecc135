"""Roles: the entry point of each supervised process of an RL run (orchestrator, trainer).

`python -m tracegym.train.roles {orchestrator|trainer} RUN_DIR` reads the run's `config.toml` and the
`endpoints.json` the launcher wrote (vLLM's URL, the served base model, each env server's address).
A role exits non-zero with one line on stderr when it fails; the launcher shows the tail of its log. Each role's
stages report their progress to its progress file (`runtimes.watchdog.reporting`), which the launcher judges. A role
whose launcher is gone (killed with -9, it could stop nothing) exits within a second rather than linger.

With `trainer.num_processes > 1` the trainer role runs once per rank under `torchrun`, whose agent is then each
rank's parent; the launcher passes its own pid down (`LAUNCHER_PID_ENV`) so the ranks still exit with it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from tracegym.core.errors import TracegymError
from tracegym.runtimes.processes import Parent, watch_parent
from tracegym.runtimes.watchdog import reporting
from tracegym.train.regeneration import STOPPED_EXIT, EmptyBatch
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.tripwire import TripwireStop

if TYPE_CHECKING:
    from tracegym.train.orchestrator import Orchestrator
    from tracegym.train.rl_config import RLConfig

ORPHANED_EXIT = 3
"""Exit code of a role whose launcher died."""
LAUNCHER_PID_ENV = "TRACEGYM_LAUNCHER_PID"
"""Set by the launcher for roles it does not start itself (trainer ranks under torchrun): the pid to exit with."""


def load_config(run_dir: Path) -> RLConfig:
    """The run's resolved config (`tracegym rl` wrote it); imported here, as it brings in torch (the trainer's
    config), which a role that only watches its launcher (`exit_with_parent`) does without."""
    from tracegym.train.rl_config import RLConfig

    return RLConfig.model_validate(RLFolder(run_dir).read_config())


def load_run(run_dir: Path) -> tuple[RLConfig, RLFolder, Endpoints]:
    folder = RLFolder(run_dir)
    return load_config(run_dir), folder, folder.read_endpoints()


def orchestrator_for(config: RLConfig, folder: RLFolder, endpoints: Endpoints) -> Orchestrator:
    """The run's orchestrator, from its parts: the policy's endpoint as vLLM serves it, the mode's signal, the
    `[orchestrator]` section; tracking turned on in the folder when `[tracking]` asks."""
    from tracegym.train.modes import build_signal
    from tracegym.train.orchestrator import build_orchestrator
    from tracegym.train.tracking import build_tracking

    orch = config.orchestrator
    endpoint = config.model.endpoint(endpoints.base_url, endpoints.base_model, weights=config.trainer.model,
                                     replicas=endpoints.replicas)
    signal = build_signal(config.mode, orch.advantage, student=endpoint, endpoints=endpoints, teacher=config.teacher,
                          sft=config.sft, opd=config.opd, truncated_reward=orch.truncated_reward,
                          cuts=orch.cuts,
                          log=folder.metrics.append)
    orchestrator = build_orchestrator(orch, config.steps, folder, endpoints, endpoint, signal)
    if tracking := build_tracking(config.tracking, folder.path, config.model_dump(mode="json")):
        folder.track(tracking)
    return orchestrator


def run_orchestrator(run_dir: Path) -> None:
    asyncio.run(orchestrator_for(*load_run(run_dir)).run())


def run_trainer(run_dir: Path) -> None:
    from tracegym.train.data_parallel import join
    from tracegym.train.image_inputs import folder_source
    from tracegym.train.trainer import build_trainer
    from tracegym.train.trainer_loop import TrainerLoop
    from tracegym.train.weight_sync import build_weight_sync, sync_mode

    config, folder, endpoints = load_run(run_dir)
    mode = sync_mode(config.weight_sync, config.trainer.lora)
    dp = join(config.trainer.device)
    trainer = build_trainer(config.trainer, dp, images=folder_source(folder.images.folder))
    sync = build_weight_sync(mode, [endpoints.base_url, *endpoints.replicas], endpoints.base_model,
                             config.trainer.model)
    TrainerLoop(folder, trainer, sync.publish, steps=config.steps, checkpoint_every=config.checkpoint_every,
                merged=mode.merged, alive=Parent().alive).run()
    dp.close()  # not after a failure: the other ranks may be inside a collective; torchrun ends them


ROLES = {"orchestrator": run_orchestrator, "trainer": run_trainer}


def exit_with_parent(parent: int, every_s: float = 0.5) -> threading.Thread:
    """Watch, on a daemon thread, that `parent` is still this process's parent (or, when it is not our parent
    but the launcher above torchrun's agent, still alive); end the process when not. `os._exit`, since the main
    thread may be deep in a training step: what a resume needs is on disk already (a checkpoint counts only once
    its DONE marker is written)."""

    def orphaned() -> None:
        print(f"the launcher (pid {parent}) is gone; exiting", file=sys.stderr, flush=True)
        os._exit(ORPHANED_EXIT)

    return watch_parent(orphaned, every_s, Parent(parent) if parent == os.getppid() else Ancestor(parent))


class Ancestor(Parent):
    """Our parent's parent (the launcher above torchrun's agent): it has exited once our parent's parent pid is
    another, as `Parent` reasons one level up (an agent that itself died re-parents us, which counts too)."""

    def alive(self) -> bool:
        try:
            stat = Path(f"/proc/{os.getppid()}/stat").read_text()
        except OSError:
            return False
        return int(stat.rsplit(")", 1)[-1].split()[1]) == self.pid


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ROLES:
        print(f"usage: python -m tracegym.train.roles {{{'|'.join(ROLES)}}} RUN_DIR", file=sys.stderr)
        return 2
    exit_with_parent(int(os.environ.get(LAUNCHER_PID_ENV, os.getppid())))
    try:
        with reporting(RLFolder(Path(argv[1])).logs, progress_name(argv[0])):
            ROLES[argv[0]](Path(argv[1]))
    except (EmptyBatch, TripwireStop) as exc:  # not a crash: the run cannot (or should not) go on, and says why
        print(f"{argv[0]}: stopped the run: {exc}", file=sys.stderr)
        return STOPPED_EXIT
    except TracegymError as exc:
        print(f"{argv[0]}: {exc.kind.value} error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def progress_name(role: str) -> str:
    """The name the role reports its progress under (`runtimes.watchdog`): a trainer rank's carries its rank."""
    rank = os.environ.get("RANK")
    return f"{role}-rank{rank}" if rank is not None and role == "trainer" else role


def exit_role(code: int) -> None:
    """End the role's process with `code`; a trainer (the one role that may be a rank of several) through
    `data_parallel.exit_process`, which skips the interpreter's shutdown where gloo's threads could abort it."""
    if "tracegym.train.data_parallel" in sys.modules:
        from tracegym.train.data_parallel import exit_process

        exit_process(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_role(main(sys.argv[1:]))
