"""Registry: a taskset is found by built-in id, entry point, `package.module:Name` or `path/to/file.py:Name`."""

from importlib.metadata import EntryPoint

import pytest

import tracegym as tg
from tracegym.envs import registry
from tracegym.tasksets.reverse_text import ReverseText

TASKSET_FILE = '''
import tracegym as tg


class Echo(tg.Taskset):
    id = "echo"

    def load(self):
        return [{"prompt": "say hi", "answer": "hi"}]


def make_echo():
    return Echo()


def not_a_taskset():
    return 42


def reward_len(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


READY = Echo()


class NoReset:
    def step(self, x: str) -> str:
        return x


class NeedsUrl:
    def __init__(self, url):
        self.url = url

    def reset(self, **row):
        return "hi"
'''


@pytest.fixture
def taskset_file(tmp_path):
    path = tmp_path / "my_tasks.py"
    path.write_text(TASKSET_FILE)
    return path


@pytest.fixture
def fake_entry_points(monkeypatch):
    """Installed entry points as the metadata source would report them."""
    installed = [
        EntryPoint(name="plugin-reverse", value="tracegym.tasksets.reverse_text:ReverseText",
                   group=registry.ENTRY_POINT_GROUP),
    ]

    def entry_points(*, group):
        return [ep for ep in installed if ep.group == group]

    monkeypatch.setattr(registry, "entry_points", entry_points)
    return installed


def test_builtin_id_loads_its_taskset_class():
    taskset = tg.load_taskset("reverse-text")
    assert isinstance(taskset, ReverseText) and taskset.id == "reverse-text"


def test_module_path_loads_the_named_class():
    assert isinstance(tg.load_taskset("tracegym.tasksets.reverse_text:ReverseText"), ReverseText)


def test_file_path_loads_the_named_class(taskset_file):
    taskset = tg.load_taskset(f"{taskset_file}:Echo")
    assert taskset.id == "echo" and [d.prompt for d in taskset] == ["say hi"]


def test_relative_file_path_resolves_from_the_working_directory(taskset_file, monkeypatch):
    monkeypatch.chdir(taskset_file.parent)
    assert tg.load_taskset("my_tasks.py:Echo").id == "echo"


def test_missing_file_is_named(tmp_path):
    with pytest.raises(tg.UsageError, match=r"taskset file '.*nowhere\.py' does not exist"):
        tg.load_taskset(f"{tmp_path}/nowhere.py:Echo")


def test_installed_entry_point_loads_by_its_name(fake_entry_points):
    assert isinstance(tg.load_taskset("plugin-reverse"), ReverseText)


def test_installed_entry_points_are_known_after_the_builtins(fake_entry_points):
    known = tg.known_tasksets()
    assert known["plugin-reverse"] == "tracegym.tasksets.reverse_text:ReverseText"
    assert list(known)[: len(registry.BUILTINS)] == list(registry.BUILTINS)


def test_entry_point_cannot_shadow_a_builtin(monkeypatch):
    shadow = EntryPoint(name="reverse-text", value="tracegym.tasksets.wordle:Wordle", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda *, group: [shadow])
    assert isinstance(tg.load_taskset("reverse-text"), ReverseText)


def test_unknown_id_suggests_the_closest_known_one():
    with pytest.raises(tg.UsageError, match=r"unknown taskset 'reverse-txet'\. Did you mean 'reverse-text'\?"):
        tg.load_taskset("reverse-txet")


def test_unknown_id_lists_installed_entry_points_too(fake_entry_points):
    with pytest.raises(tg.UsageError, match=r"Known: .*plugin-reverse"):
        tg.load_taskset("zzz")


def test_unknown_id_with_nothing_close_makes_no_suggestion():
    with pytest.raises(tg.UsageError) as info:
        tg.load_taskset("qqqqqqqq")
    assert "Did you mean" not in str(info.value)


def test_missing_module_is_named():
    with pytest.raises(tg.UsageError, match=r"cannot import 'no_such_package\.tasks'"):
        tg.load_taskset("no_such_package.tasks:Thing")


def test_missing_attribute_is_named():
    with pytest.raises(tg.UsageError, match=r"'tracegym\.tasksets\.reverse_text' has no 'Nope'"):
        tg.load_taskset("tracegym.tasksets.reverse_text:Nope")


def test_missing_attribute_in_a_file_is_named(taskset_file):
    with pytest.raises(tg.UsageError, match=r"has no 'Nope'"):
        tg.load_taskset(f"{taskset_file}:Nope")


def test_factory_function_returning_a_taskset_is_called(taskset_file):
    assert tg.load_taskset(f"{taskset_file}:make_echo").id == "echo"


def test_factory_returning_something_else_is_refused(taskset_file):
    with pytest.raises(tg.UsageError, match=r"gave a int, not a Taskset"):
        tg.load_taskset(f"{taskset_file}:not_a_taskset")


def test_ready_made_instance_loads_as_it_is(taskset_file):
    first = tg.load_taskset(f"{taskset_file}:READY")
    assert first is tg.load_taskset(f"{taskset_file}:READY")


def test_ready_made_instance_refuses_a_config(taskset_file):
    with pytest.raises(tg.UsageError, match=r"ready-made instance and takes no config"):
        tg.load_taskset(f"{taskset_file}:READY", {"seed": 1})


def test_taskset_object_passes_through_unchanged():
    taskset = tg.Taskset(id="inline", data=[{"prompt": "x"}])
    assert tg.load_taskset(taskset) is taskset


def test_class_is_built_with_the_config():
    assert tg.load_taskset("reverse-text", {"seed": 3}).config.seed == 3


def test_ready_made_instance_accepts_the_options_it_already_has(taskset_file):
    ready = tg.load_taskset(f"{taskset_file}:READY")
    assert tg.load_taskset(f"{taskset_file}:READY", ready.config.model_dump()) is ready


def test_ready_made_instance_given_another_option_value_names_the_option(taskset_file):
    with pytest.raises(tg.UsageError, match=r"ready-made instance.*'seed'"):
        tg.load_taskset(f"{taskset_file}:READY", {"seed": 1})


def test_zero_argument_factory_is_called_with_no_options(taskset_file):
    assert tg.load_taskset(f"{taskset_file}:make_echo", {}).id == "echo"


def test_zero_argument_factory_given_an_option_names_it(taskset_file):
    with pytest.raises(tg.UsageError, match=r"make_echo\(\) takes no options.*'seed'"):
        tg.load_taskset(f"{taskset_file}:make_echo", {"seed": 1})


def test_file_taskset_imports_a_module_beside_it(tmp_path):
    (tmp_path / "sibling_rows.py").write_text('ROWS = [{"prompt": "p", "answer": "a"}]\n')
    (tmp_path / "sibling_tasks.py").write_text(
        "import tracegym as tg\nfrom sibling_rows import ROWS\n\n"
        "class Sib(tg.Taskset):\n    id = 'sib'\n\n    def load(self):\n        return ROWS\n")
    assert [d.prompt for d in tg.load_taskset(f"{tmp_path / 'sibling_tasks.py'}:Sib")] == ["p"]


def test_file_taskset_can_import_beside_it_after_loading(tmp_path):
    """Task code may import lazily, at rollout time (in this process or an env-server worker)."""
    (tmp_path / "lazy_helper.py").write_text("ANSWER = 'late'\n")
    (tmp_path / "lazy_tasks.py").write_text(
        "import tracegym as tg\n\n"
        "class Lazy(tg.Taskset):\n    id = 'lazy'\n\n    def load(self):\n"
        "        import lazy_helper\n        return [{'prompt': 'p', 'answer': lazy_helper.ANSWER}]\n")
    taskset = tg.load_taskset(f"{tmp_path / 'lazy_tasks.py'}:Lazy")
    assert [d.answer for d in taskset] == ["late"]


def test_syntax_error_in_a_taskset_file_names_the_file_and_line(tmp_path):
    bad = tmp_path / "broken_syntax.py"
    bad.write_text("import tracegym as tg\n\ndef oops(:\n    pass\n")
    with pytest.raises(tg.UsageError, match=r"broken_syntax\.py.*line 3"):
        tg.load_taskset(f"{bad}:Anything")


def test_taskset_file_that_raises_on_import_is_named_and_not_half_loaded(tmp_path):
    bad = tmp_path / "raises_on_import.py"
    bad.write_text("raise RuntimeError('no database here')\n")
    for _ in range(2):  # the second load must not find a half-made module
        with pytest.raises(tg.UsageError, match=r"raises_on_import\.py.*RuntimeError: no database here"):
            tg.load_taskset(f"{bad}:Anything")


def test_a_class_that_is_neither_a_taskset_nor_an_environment_is_named(taskset_file):
    with pytest.raises(tg.UsageError, match=r"NoReset' is a class that is neither a Taskset nor a TRL environment"):
        tg.load_taskset(f"{taskset_file}:NoReset")


def test_an_environment_class_that_needs_constructor_arguments_is_refused_before_any_rollout(taskset_file):
    with pytest.raises(tg.UsageError, match=r"NeedsUrl\(\) needs 'url', but an environment class is made with no"):
        tg.load_taskset(f"{taskset_file}:NeedsUrl", {"rewards": ["x"]})


def test_a_function_that_is_no_factory_named_as_the_id_is_refused_naming_it(taskset_file):
    with pytest.raises(tg.UsageError, match=r"reward_len\(prompts, completions, \*\*kwargs\) cannot be called with "
                                             r"the taskset's options alone.*--taskset.rewards"):
        tg.load_taskset(f"{taskset_file}:reward_len", {"seed": 0})


def test_a_server_id_without_a_url_scheme_says_how_to_write_it():
    with pytest.raises(tg.UsageError, match=r"'openenv:127.0.0.1:9'.* e.g. 'openenv:http://127.0.0.1:9'"):
        tg.load_taskset("openenv:127.0.0.1:9")
