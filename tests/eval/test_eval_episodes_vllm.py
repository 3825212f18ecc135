"""Slow: a real self-play episode of kuhn-poker on the embedded model, run by `tracegym eval` through an env server
with the token client: every member's trace carries exact tokens on one branch (each prompt extended the last)."""

import json
import subprocess
import sys

import pytest

from tracegym.eval.run_folder import RunFolder
from tracegym.train.samples import trace_samples, validate

pytestmark = pytest.mark.slow


def test_self_play_kuhn_poker_on_the_embedded_model_through_an_env_server(tmp_path):
    command = [sys.executable, "-m", "tracegym.cli.main", "eval", "kuhn-poker", "-n", "2", "--model.client", "tokens",
               "--sampling.max-tokens", "12", "--sampling.seed", "1", "--output-dir", str(tmp_path), "--no-rich"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [run] = list(tmp_path.glob("kuhn-poker--SmolLM2-135M-Instruct/*"))
    assert (run / "logs" / "env").is_dir()  # the episodes ran in an env server's workers
    episodes = RunFolder(run).log.read().episodes
    assert len(episodes) == 2
    for episode in episodes:
        assert episode.ended_normally, episode.error
        assert set(episode.rewards.values()) <= {-1.0, 1.0, 0.0} and episode.outcomes
        played = [t for t in episode.traces.values() if t.num_turns]  # a forfeit can end a hand before a seat acts
        assert played and all(t.member in episode.members and t.episode_id == episode.id for t in played)
        for trace in played:
            assert len(trace.branches) == 1 and validate(trace) == []  # exact tokens, never forked
            [sample] = trace_samples(trace)
            assert sum(sample.loss_mask) > 0
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["seats"]) == {"player_0", "player_1"} and summary["num_episodes"] == 2
