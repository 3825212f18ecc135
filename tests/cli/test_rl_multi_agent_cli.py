"""`tracegym rl` on multi-agent configs: the shipped self-play config resolves; a bad advantage or seat exits 2
with one line naming the key."""

from pathlib import Path

import pytest

from tracegym.cli.main import main

SELFPLAY = Path(__file__).parents[2] / "configs" / "rl" / "kuhn_poker_selfplay.toml"


def test_the_shipped_self_play_config_resolves_with_rae(capsys):
    assert main(["rl", "@", str(SELFPLAY), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert 'name = "rae"' in out and "max_loras = 1" in out


@pytest.mark.parametrize(("toml", "named"), [
    ('[orchestrator.advantage]\nname = "nope"\n', "[orchestrator.advantage] name: "),
    ('[orchestrator.advantage]\nname = "no_such_module_xyz:f"\n', "[orchestrator.advantage] name: "),
    ('[orchestrator.advantage]\nname = "rae"\nalpha = 1.0\n', "[orchestrator.advantage] alpha: "),
    ('weight_sync = "lora"\n[[orchestrator.train.envs]]\nid = "kuhn-poker"\nseats.player_9 = { trainable = true }\n',
     "seats: "),
])
def test_a_bad_advantage_or_seat_exits_2_with_one_line_naming_the_key(tmp_path, capsys, toml, named):
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    assert main(["rl", "@", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err
