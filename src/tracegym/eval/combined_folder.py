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
from tracegym.eval.combined_summary import CombinedSummary, combine, taskset_row
from tracegym.eval.eval_config import EvalConfig, EvalEnv, combined_config_class, is_combined_data, validate_saved
from tracegym.eval.run_folder import SUMMARY, RunFolder
from tracegym.eval.run_summary import summarize_run

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

    @classmethod
    def open_if_combined(cls, path: Path) -> CombinedFolder | None:
        """The combined run folder at `path`; None when it is a run folder of one taskset (a UsageError when it
        is no run folder at all)."""
        folder = RunFolder.open(path)
        return cls(path) if is_combined_data(folder.read_config()) else None

    def config(self) -> EvalConfig:
        """The combined run's saved config (its `eval.env` entries); a bad one is a UsageError naming the file."""
        return validate_saved(combined_config_class(), self.read_config(), str(self.config_path))

    def summary(self) -> CombinedSummary:
        """The combined summary of what the member folders hold now (a taskset whose run wrote no summary yet:
        not run)."""
        config = self.config()
        rows, not_run = [], []
        for env in config.eval.env:
            if not (self.member(env) / SUMMARY).is_file():  # its run never began (or never got as far as one)
                not_run.append(env.folder_name())
                continue
            member = RunFolder.open(self.member(env))
            saved = validate_saved(EvalConfig, member.read_config(), str(member.config_path))
            summary = summarize_run(member.log.read().episodes, pass_threshold=saved.pass_threshold,
                                    wall_time=member.earlier_wall_time() or None, cuts=saved.cuts)
            rows.append(taskset_row(env.folder_name(), env.id, summary))
        return combine(rows, not_run)

    def member(self, env: EvalEnv) -> Path:
        """Where the run folder of `env` is (or will be)."""
        return self.path / env.folder_name()

    def create_member(self, env: EvalEnv) -> RunFolder:
        """A new, empty run folder for `env`, inside this one."""
        folder = RunFolder(make_run_dir(self.path, env.folder_name()))
        folder.logs.mkdir()
        return folder
