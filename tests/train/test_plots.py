"""RL run plots: files written from metrics, held-out curves distinguishable from the train curve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracegym.core.errors import UsageError
from tracegym.train.plots import TRAIN_COLOR, evaluated_policy, held_out_colors, plot_run, win_rate_keys


def _write_metrics(run_dir: Path) -> None:
    lines = [{"step": s, "reward": 0.1 + s / 100, "completion_tokens_mean": 40.0, "staleness": 1} for s in range(5)]
    lines += [{"env": env, "eval_step": s, "eval_reward": 0.2, "eval_reward_ci95": 0.02}
              for env in ("reverse-text", "wordle") for s in (0, 4)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines) + '{"step": 5, "rew')


def test_held_out_colors_never_reuse_the_train_colour() -> None:
    colors = held_out_colors([f"env-{i}" for i in range(20)])
    assert TRAIN_COLOR not in colors.values()


def test_held_out_colors_differ_between_envs() -> None:
    colors = held_out_colors(["a", "b", "c"])
    assert len(set(colors.values())) == 3


def test_plot_run_writes_reward_lengths_and_staleness_pngs(tmp_path: Path) -> None:
    _write_metrics(tmp_path)
    written = plot_run(tmp_path)
    assert sorted(p.name for p in written) == ["lengths.png", "reward.png", "staleness.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)


def test_plot_run_without_metrics_names_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"metrics\.jsonl"):
        plot_run(tmp_path)


def test_an_opd_run_also_gets_its_per_token_kl_curve(tmp_path: Path) -> None:
    lines = [{"step": s, "reward": 0.1, "completion_tokens_mean": 9.0, "staleness": 1, "opd/kl": 3.0 - s / 2}
             for s in range(4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    written = plot_run(tmp_path)
    assert "kl.png" in [p.name for p in written] and (tmp_path / "plots" / "kl.png").read_bytes()[:4] == b"\x89PNG"


def test_a_held_out_point_is_drawn_at_the_policy_it_ran_on_not_its_eval_step() -> None:
    assert evaluated_policy({"eval_step": 2, "policy_version": 0, "eval_reward": 0.1}) == 0


def test_a_held_out_point_without_a_policy_version_is_drawn_at_its_eval_step() -> None:
    assert evaluated_policy({"eval_step": 2, "eval_reward": 0.1}) == 2


def test_a_multi_agent_run_gets_win_rate_curves_per_seat_for_the_learner_and_held_out(tmp_path: Path) -> None:
    lines = [{"step": s, "reward": 0.0, "completion_tokens_mean": 9.0, "staleness": 0, "seat/player_0/win_rate": 0.5,
              "seat/player_1/win_rate": 0.5, "learner/win_rate": 0.4 + s / 10} for s in range(3)]
    lines += [{"env": "kuhn-poker", "eval_step": s, "policy_version": s, "eval_reward": 0.1, "eval_win_rate": 0.3,
               "eval_win_rate_ci95": 0.1} for s in (0, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    assert win_rate_keys(lines) == ["seat/player_0/win_rate", "seat/player_1/win_rate", "learner/win_rate"]
    assert "win_rate.png" in [p.name for p in plot_run(tmp_path)]
    assert (tmp_path / "plots" / "win_rate.png").read_bytes()[:4] == b"\x89PNG"


def test_a_single_agent_run_gets_no_win_rate_curve(tmp_path: Path) -> None:
    _write_metrics(tmp_path)
    assert "win_rate.png" not in [p.name for p in plot_run(tmp_path)]
