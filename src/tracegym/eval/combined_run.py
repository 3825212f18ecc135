"""Combined run: one `tracegym eval` of several tasksets: each runs, in turn and against the one model, into its own
run folder inside the combined run folder (`eval.combined_folder`), as a run of that taskset alone would; then the
combined summary (`eval.combined_summary`) is written and shown. A resume finishes each taskset's run (`--resume`
of it alone: the missing and errored rollouts) and starts those not begun."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import IO, Any

from rich.console import Console

from tracegym.config.run_dir import owned
from tracegym.envs.taskset import Taskset
from tracegym.eval.combined_folder import CombinedFolder
from tracegym.eval.combined_summary import CombinedSummary, combined_table
from tracegym.eval.episode_summary import EpisodeSummary
from tracegym.eval.eval_config import EvalConfig, EvalEnv
from tracegym.eval.eval_parts import EvalParts, eval_parts
from tracegym.eval.eval_run import Work, execute, work_for
from tracegym.eval.run_folder import CONFIG, RunFolder
from tracegym.eval.summary import Summary
from tracegym.models.endpoint import Endpoint
from tracegym.models.launch import serve
from tracegym.runtimes.watchdog import Stalled

RunSummary = Summary | EpisodeSummary


@dataclass
class Member:
    """One taskset of the run: its entry, its parts, and the config its own run folder keeps."""

    env: EvalEnv
    parts: EvalParts
    config: dict[str, Any]
    """Its run's config as `config.toml` holds it (a single-taskset run's: `--resume` of its folder alone works)."""
    work: Work | None = None
    """What to run, found before the combined folder was made (a new run); None: found from its folder."""

    @classmethod
    def of(cls, env: EvalEnv, config: EvalConfig, taskset: Taskset, *, new: bool) -> Member:
        """The member for entry `env`, its config and loaded taskset; `new`: its work found now (a new run)."""
        parts = eval_parts(config, taskset)
        return cls(env, parts, config.to_toml_dict(), work_for(parts) if new else None)


@dataclass
class CombinedRun:
    """A run of several tasksets into `folder`."""

    folder: CombinedFolder
    members: list[Member]
    out: IO[str] = field(default_factory=lambda: sys.stdout)

    def run(self, endpoint: Endpoint | None) -> tuple[CombinedSummary, list[RunSummary]]:
        """Run every member in turn against `endpoint` (None: the model served here, once, when any member has
        work left); return the combined summary (also written and shown) and each member's. Ctrl-C or a stalled
        stage writes the combined summary so far and says how to resume."""
        done: list[RunSummary] = []
        with contextlib.ExitStack() as stack:
            opened = [self._open(member, stack) for member in self.members]
            if endpoint is None and any(work.todo for _, work, _ in opened):
                model = self.members[0].parts.model
                endpoint = stack.enter_context(serve(model, log_path=self.folder.logs / "vllm.log"))
            for member, (folder, work, resume) in zip(self.members, opened, strict=True):
                try:
                    done.append(execute(member.parts, folder, work, resume=resume, out=self.out, endpoint=endpoint))
                except (KeyboardInterrupt, Stalled):
                    self.conclude()
                    print(f"finish every taskset of the run with: tracegym eval --resume {self.folder.path}",
                          file=self.out, flush=True)
                    raise
        return self.conclude(), done

    def _open(self, member: Member, stack: contextlib.ExitStack) -> tuple[RunFolder, Work, bool]:
        """A member's run folder (held for the run), what it has left to run, and whether it is a resume."""
        path = self.folder.member(member.env)
        if (path / CONFIG).is_file():
            folder = RunFolder.open(path)
            stack.enter_context(owned(folder.path))
            return folder, work_for(member.parts, folder), True
        folder = RunFolder(path) if path.is_dir() else self.folder.create_member(member.env)  # made, never written
        folder.logs.mkdir(exist_ok=True)
        stack.enter_context(owned(folder.path))
        folder.write_config(member.config)
        return folder, member.work or work_for(member.parts), False

    def conclude(self) -> CombinedSummary:
        """The combined summary of the member folders as they are now (`CombinedFolder.summary`), written and
        shown."""
        summary = self.folder.summary()
        self.folder.write_summary(summary.model_dump(mode="json"))
        title = f"{len(self.members)} tasksets · {self.members[0].parts.model.display_name()} · {self.folder.path}"
        print(file=self.out)
        Console(file=self.out).print(combined_table(summary, title=title))
        print(f"combined run folder: {self.folder.path}", file=self.out, flush=True)
        return summary
