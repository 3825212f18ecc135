"""`tracegym eval` config: positional taskset, short flags, TOML files merged left to right, typed taskset
options, errors that name the key and suggest the closest one."""

import ast
import inspect
import itertools
import textwrap

import pytest
from pydantic import BaseModel

import tracegym as tg
from tracegym.eval.eval_config import find_taskset_id, parse_eval_args


def test_positional_taskset_and_short_flags():
    config = parse_eval_args(["reverse-text", "-n", "50", "-r", "4", "-c", "8"])
    assert (config.taskset.id, config.num_tasks, config.rollouts, config.concurrency) == ("reverse-text", 50, 4, 8)


def test_dash_m_names_the_model():
    assert parse_eval_args(["reverse-text", "-m", "Qwen/Qwen3-8B"]).model.name == "Qwen/Qwen3-8B"


def test_tokenizer_and_renderer_reach_the_model_choice():
    config = parse_eval_args(["wordle", "--client", "tokens", "--tokenizer", "/tok", "--renderer", "qwen3"])
    choice = config.model_choice()
    assert (choice.client, choice.tokenizer, choice.renderer) == ("tokens", "/tok", "qwen3")


def test_dotted_overrides_reach_nested_sections():
    config = parse_eval_args(["reverse-text", "--sampling.temperature", "0.7", "--timeouts.model", "5"])
    assert config.sampling.temperature == 0.7 and config.timeouts.model == 5.0


def test_taskset_options_are_typed_by_the_tasksets_config():
    config = parse_eval_args(["reverse-text", "--taskset.max-words", "5"])
    assert config.taskset_options()["max_words"] == 5


def test_a_misspelt_taskset_option_suggests_the_right_one():
    with pytest.raises(tg.UsageError, match=r"did you mean --taskset\.max-words"):
        parse_eval_args(["reverse-text", "--taskset.max-wrods", "5"])


def test_a_misspelt_top_level_option_suggests_the_right_one():
    with pytest.raises(tg.UsageError, match=r"did you mean --sampling\.temperature"):
        parse_eval_args(["reverse-text", "--sampling.temprature", "1"])


def test_a_wrongly_typed_taskset_option_names_the_flag():
    with pytest.raises(tg.UsageError, match=r"--taskset\.max-words"):
        parse_eval_args(["reverse-text", "--taskset.max-words", "many"])


def test_an_unknown_taskset_suggests_the_closest_id():
    with pytest.raises(tg.UsageError, match="Did you mean 'reverse-text'"):
        parse_eval_args(["revers-text"])


def test_toml_files_merge_left_to_right_and_flags_win(tmp_path):
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text('rollouts = 2\nnum_tasks = 5\n[taskset]\nid = "reverse-text"\nmax_words = 2\n')
    second.write_text("rollouts = 3\n[sampling]\ntemperature = 0.5\n")
    config = parse_eval_args(["@", str(first), "@", str(second), "-n", "7"])
    assert (config.rollouts, config.num_tasks, config.sampling.temperature) == (3, 7, 0.5)
    assert config.taskset_options()["max_words"] == 2


def test_the_taskset_id_is_found_in_a_toml_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[taskset]\nid = "wordle"\n')
    assert find_taskset_id(["@", str(path)]) == "wordle"


def test_the_taskset_id_is_found_in_files_as_the_parser_reads_them(tmp_path):
    nested, last = tmp_path / "n.toml", tmp_path / "d.json"
    nested.write_text('id = "wordle"\n')
    last.write_text('{"taskset": {"id": "arithmetic"}}')
    assert find_taskset_id(["--taskset", "@", str(nested)]) == "wordle"
    assert find_taskset_id(["--taskset", "@", str(nested), "@", str(last)]) == "arithmetic"
    assert find_taskset_id(["@", str(last), "--taskset.id", "reverse-text"]) == "reverse-text"


def test_a_malformed_config_file_is_named_before_the_taskset_is_looked_up(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[taskset\n")
    with pytest.raises(tg.UsageError, match=r"config file '.*bad\.toml' is not valid TOML"):
        parse_eval_args(["@", str(path)])


def test_a_missing_config_file_is_named(tmp_path):
    with pytest.raises(tg.UsageError, match=r"nope\.toml"):
        parse_eval_args(["@", str(tmp_path / "nope.toml")])


def test_the_resolved_config_round_trips_through_toml(tmp_path):
    import tomllib

    import tomli_w

    config = parse_eval_args(["reverse-text", "-n", "3", "--sampling.stop", "a", "b"])
    again = parse_eval_args([], defaults=tomllib.loads(tomli_w.dumps(config.to_toml_dict())))
    assert again.model_dump(mode="json") == config.model_dump(mode="json")


def help_text(capsys, *args: str) -> str:
    """`tracegym eval ARGS --help` with the panel borders dropped and whitespace collapsed (docstrings wrap)."""
    from tracegym.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["eval", *args, "--help", "--plain"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.replace("│", " ").split())


def attribute_docstrings(cls) -> dict[str, str]:
    """`{field: docstring}` read from the source of `cls` and its bases (the string under each annotated field)."""
    found: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if not base.__module__.startswith("tracegym"):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(base))).body[0].body
        for stmt, after in itertools.pairwise(body):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                found[stmt.target.id] = " ".join(after.value.value.split())
    return found


def documented_fields(model, prefix: str = ""):
    """(flag, docstring) of every documented leaf field of a config model, sections included."""
    docs = attribute_docstrings(model)
    for name, field in model.model_fields.items():
        flag = f"--{prefix}{name.replace('_', '-')}"
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from documented_fields(field.annotation, f"{prefix}{name}.")
        elif name in docs:
            yield flag, docs[name]


def test_help_lists_every_eval_field_with_its_docstring(capsys):
    from tracegym.eval.eval_config import EvalConfig

    text = help_text(capsys, "reverse-text")
    fields = [f for f in documented_fields(EvalConfig) if not f[0].startswith("--taskset.")]
    assert len(fields) > 20
    missing = [flag for flag, doc in fields if flag not in text or doc not in text]
    assert missing == []


def test_help_lists_the_chosen_tasksets_own_options(capsys):
    from tracegym.tasksets.reverse_text import ReverseTextConfig

    text = help_text(capsys, "reverse-text")
    fields = list(documented_fields(ReverseTextConfig, "taskset."))
    assert {"--taskset.max-words", "--taskset.min-words"} <= {flag for flag, _ in fields}
    assert [flag for flag, doc in fields if flag not in text or doc not in text] == []


def test_help_lists_the_options_of_a_factory_built_taskset(capsys):
    assert "--taskset.max-step INT" in help_text(capsys, "counter-env")


def test_help_names_the_resume_flag(capsys):
    assert "tracegym eval --resume RUN_DIR" in help_text(capsys)


def test_an_unknown_key_in_a_toml_file_suggests_the_right_one(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('rolouts = 2\n[taskset]\nid = "reverse-text"\n[sampling]\ntemprature = 0.5\n')
    with pytest.raises(tg.UsageError, match=r"c\.toml: rolouts: unknown key; did you mean rollouts\?") as error:
        parse_eval_args(["@", str(path)])
    assert "c.toml: [sampling] temprature: unknown key; did you mean [sampling] temperature?" in str(error.value)


def test_a_misspelt_section_prefix_suggests_the_whole_flag():
    with pytest.raises(tg.UsageError, match=r"did you mean --sampling\.temperature\?"):
        parse_eval_args(["reverse-text", "--samplin.temperature", "0.7"])


def test_the_old_flat_model_keys_still_work_with_a_warning(tmp_path, capsys):
    path = tmp_path / "old.toml"
    path.write_text('model = "my-model"\nbase_url = "http://host:8000/v1"\nclient = "tokens"\n'
                    '[taskset]\nid = "reverse-text"\n')
    config = parse_eval_args(["@", str(path), "--renderer", "qwen3"])
    assert (config.model.name, config.model.base_url) == ("my-model", ["http://host:8000/v1"])
    assert (config.model.client, config.model.renderer) == ("tokens", "qwen3")
    assert "'base_url' was renamed 'model.base_url'" in capsys.readouterr().err


@pytest.mark.parametrize(("old", "new", "value"), [
    (["--env-address", "tcp://h:5555"], "'env_address' was renamed 'env.address'", ["tcp://h:5555"]),
    (["--worker-timeout", "7"], "'worker_timeout' was renamed 'env.worker_timeout'", 7.0),
])
def test_the_old_env_server_flags_still_work_with_a_warning(old, new, value, capsys):
    config = parse_eval_args(["reverse-text", *old])
    assert value in (config.env.address, config.env.worker_timeout)
    assert new in capsys.readouterr().err


def test_an_old_env_server_key_in_a_file_lands_in_the_env_section(tmp_path, capsys):
    path = tmp_path / "old.toml"
    path.write_text('env_address = ["tcp://h1:5555", "tcp://h2:5555"]\n[taskset]\nid = "reverse-text"\n')
    assert parse_eval_args(["@", str(path)]).env.address == ["tcp://h1:5555", "tcp://h2:5555"]
    assert "'env_address' was renamed 'env.address'" in capsys.readouterr().err


def test_a_run_saved_with_the_old_env_server_keys_resumes():
    saved = {"taskset": {"id": "reverse-text"}, "worker_timeout": 9.0}
    assert parse_eval_args([], defaults=saved).env.worker_timeout == 9


def test_a_run_saved_with_the_flat_model_keys_resumes():
    saved = {"taskset": {"id": "reverse-text"}, "model": "my-model", "max_model_len": 4096}
    config = parse_eval_args([], defaults=saved)
    assert (config.model.name, config.model.max_model_len) == ("my-model", 4096)


def test_an_eval_attempt_never_outlives_the_model_stage():
    config = parse_eval_args(["reverse-text", "--timeouts.model", "5"])
    assert config.model_choice().timeout == 5 and config.model.timeout == 300
