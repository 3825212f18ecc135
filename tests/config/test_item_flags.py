"""Item flags: `--a.b.N.key VALUE` reaches a key of one item of a list (an environment of a phase), over the files'
list, a JSON flag's or the default; a bad index or value is one line naming the flag."""

import pytest
from pydantic import BaseModel, ConfigDict, Field
from pydantic_config import BaseConfig

import tracegym as tg
from tracegym.config.command_line import parse_command
from tracegym.train.rl_config import parse_rl_args


class Play(BaseModel):
    model_config = ConfigDict(extra="forbid")
    learner: str = "all"
    latest: int = 4


class Env(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    play: Play = Play()


class Phase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    envs: list[Env] = Field(default_factory=lambda: [Env(id="default-env")])


class Command(BaseConfig):
    model_config = ConfigDict(extra="forbid")
    train: Phase = Phase()
    dry_run: bool = False


def test_an_item_flag_sets_a_key_of_the_item_a_file_lists(tmp_path):
    (tmp_path / "run.toml").write_text('[[train.envs]]\nid = "a"\n[[train.envs]]\nid = "b"\n')
    config, _ = parse_command(Command, ["@", str(tmp_path / "run.toml"), "--train.envs.1.play.learner", "alternate",
                                       "--train.envs.1.play.latest=2", "--dry-run"], prog="t")
    assert [(e.id, e.play.learner, e.play.latest) for e in config.train.envs] == [("a", "all", 4),
                                                                                  ("b", "alternate", 2)]
    assert config.dry_run


def test_an_item_flag_takes_a_table_as_json_over_a_list_given_as_a_json_flag():
    config, _ = parse_command(Command, ["--train.envs", '[{"id": "a"}]', "--train.envs.0.play",
                                        '{"learner": "random"}'], prog="t")
    assert config.train.envs[0].play.learner == "random" and config.train.envs[0].id == "a"


def test_an_item_flag_without_a_list_given_changes_the_default_one():
    config, _ = parse_command(Command, ["--train.envs.0.play.learner", "alternate"], prog="t")
    assert [(e.id, e.play.learner) for e in config.train.envs] == [("default-env", "alternate")]


def test_an_index_the_list_has_not_is_refused_naming_the_flag():
    with pytest.raises(tg.UsageError, match=r"--train\.envs\.2\.play\.learner: train\.envs has 1 item \(index 0\); "
                                            r"give the whole list to add one"):
        parse_command(Command, ["--train.envs.2.play.learner", "x"], prog="t")


def test_a_bad_value_through_an_item_flag_is_refused_naming_that_flag():
    with pytest.raises(tg.UsageError, match=r"--train\.envs\.0\.play\.latest: Input should be a valid integer"):
        parse_command(Command, ["--train.envs.0.play.latest", "many"], prog="t")


def test_an_item_flag_without_a_value_is_refused_naming_it():
    with pytest.raises(tg.UsageError, match=r"--train\.envs\.0\.play\.learner needs a value"):
        parse_command(Command, ["--train.envs.0.play.learner"], prog="t")


def test_an_rl_environment_s_play_is_set_from_the_command_line_and_its_seats_checked():
    config, _ = parse_rl_args(["@", "configs/rl/kuhn_poker_selfplay.toml", "--orchestrator.train.envs.0.play.learner",
                               "alternate", "--orchestrator.train.envs.0.play.opponent", "script",
                               "--orchestrator.train.envs.0.play.script", "nash"])
    play = config.orchestrator.train.envs[0].play
    assert (play.opponent, play.script) == ("script", "nash")
    with pytest.raises(tg.UsageError, match=r"--orchestrator\.train\.envs\.0\.play\.script: script 'perfect'"):
        parse_rl_args(["@", "configs/rl/kuhn_poker_selfplay.toml", "--orchestrator.train.envs.0.play",
                       '{"learner": "alternate", "opponent": "script", "script": "perfect"}'])
