"""Combined run folder: where a run of several tasksets lives: its `config.toml` (the `eval.env` entries),
`summary.json` (every taskset's figures, `eval.combined_summary`), `logs/`, and one run folder per taskset inside
it, named by its entry (`reverse-text/`, ...), each a whole run folder of its own (`tracegym show` and `--resume`
work on it alone too).

    outputs/reverse-text_wordle--<model>/<run-id>/
      config.toml  summary.json  logs/
      reverse-text/  config.toml traces.jsonl episodes.jsonl summary.json logs/
      wordle/        ...
"""

from __future__ import annotations

from pathlib import Path

from tracegym.config.run_dir import make_run_dir
from tracegym.eval.eval_config import EvalEnv
from tracegym.eval.run_folder import RunFolder

MAX_NAME = 60
"""Longest folder name made of the tasksets' names; more tasksets are named by their count."""


class CombinedFolder(RunFolder):
    """A combined run's folder; `create` a new one or `open` an existing one (`RunFolder`'s)."""

    @classmethod
    def create_for(cls, output_dir: Path, envs: list[EvalEnv], model: str, run_id: str | None = None) -> CombinedFolder:
        """A new, empty combined run folder, named by its tasksets (`a_b_c--<model>`, or `3-tasksets--<model>` when
        that is too long)."""
        joined = "_".join(e.folder_name() for e in envs)
        folder = cls.create(output_dir, joined if len(joined) <= MAX_NAME else f"{len(envs)}-tasksets", model, run_id)
        return cls(folder.path)

    def member(self, env: EvalEnv) -> Path:
        """Where the run folder of `env` is (or will be)."""
        return self.path / env.folder_name()

    def create_member(self, env: EvalEnv) -> RunFolder:
        """A new, empty run folder for `env`, inside this one."""
        folder = RunFolder(make_run_dir(self.path, env.folder_name()))
        folder.logs.mkdir()
        return folder
