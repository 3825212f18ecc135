"""Tasksets: list and lazy data, head and seeded shuffle views, infinite tasksets, task keys, rows, configs."""

import itertools
import random

import pytest

import tracegym as tg
from tracegym.envs.taskset import seeded_rows

ROWS = [{"prompt": f"q{i}", "answer": i} for i in range(20)]


class Counting(tg.Taskset):
    """An infinite generator taskset that records how many rows it produced."""

    id = "counting"
    infinite = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.produced = 0

    def load(self):
        for i in itertools.count():
            self.produced += 1
            yield {"prompt": f"q{i}", "answer": i}


class Lazy(tg.Taskset):
    """A finite generator taskset of ten rows that records how many it produced."""

    id = "lazy"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.produced = 0

    def load(self):
        for i in range(10):
            self.produced += 1
            yield {"prompt": f"q{i}", "answer": i}


class Target(tg.TaskData):
    target: int
    """A task-specific field."""


class TargetTask(tg.Task[Target]):
    """Reads Target rows (the taskset reads its rows as its task's row type)."""


class Targets(tg.Taskset):
    id = "targets"
    task_class = TargetTask


class Opts(tg.TasksetConfig):
    """Options of the test taskset."""

    size: int = 4
    """How many tasks."""


class Sized(tg.Taskset):
    id = "sized"
    Config = Opts

    def load(self):
        return [{"prompt": str(i)} for i in range(self.config.size)]


class Drawn(tg.TasksetConfig):
    """Options of the generated test tasksets."""

    num_tasks: int = 5
    """How many tasks."""


def draw(rng: random.Random, cfg: Drawn, index: int) -> tg.TaskData:
    return tg.TaskData(prompt=f"q{index}", answer=rng.randint(0, 99))


class Generated(tg.Taskset[Drawn]):
    id = "generated"
    row_maker = draw


class Endless(tg.Taskset):
    id = "endless"
    infinite = True
    row_maker = draw


def prompts(taskset):
    return [d.prompt for d in taskset]


# --- data ------------------------------------------------------------------------------------------------
def test_list_data_yields_task_data_in_order():
    taskset = tg.Taskset(id="t", data=ROWS)
    tasks = list(taskset)
    assert all(isinstance(d, tg.TaskData) for d in tasks)
    assert [d.answer for d in tasks] == list(range(20)) and len(taskset) == 20


def test_taskset_without_data_or_load_is_a_usage_error():
    with pytest.raises(tg.UsageError, match=r"taskset 'empty' has no data"):
        list(tg.Taskset(id="empty"))


def test_generator_taskset_is_read_lazily():
    view = Counting().head(3)
    assert prompts(view) == ["q0", "q1", "q2"]
    assert view.produced == 3


def test_a_row_maker_draws_num_tasks_seeded_rows():
    taskset = Generated({"num_tasks": 3, "seed": 4})
    assert list(taskset.load()) == list(seeded_rows(draw, Drawn(num_tasks=3, seed=4), 3))
    assert len(taskset) == 3 and taskset[2].key == "2"


def test_a_row_maker_of_an_infinite_taskset_draws_an_endless_stream():
    assert prompts(Endless().head(30)) == [f"q{i}" for i in range(30)]


def test_a_row_maker_needs_num_tasks_unless_the_taskset_is_infinite():
    with pytest.raises(TypeError, match=r"Bare: row_maker needs TasksetConfig.num_tasks \(or infinite = True\)"):
        type("Bare", (tg.Taskset,), {"row_maker": draw})


def test_an_overridden_load_wins_over_the_row_maker():
    class Fixed(Generated):
        def load(self):
            return [{"prompt": "only"}]

    assert prompts(Fixed()) == ["only"]


def test_task_is_built_fresh_for_every_rollout():
    taskset = tg.Taskset(id="t", data=ROWS)
    first, second = taskset.task(ROWS[0]), taskset.task(ROWS[0])
    assert first is not second and first.data == second.data and first.taskset_id == "t"


# --- views -----------------------------------------------------------------------------------------------
def test_head_gives_the_first_n_tasks():
    assert prompts(tg.Taskset(id="t", data=ROWS).head(3)) == ["q0", "q1", "q2"]


def test_head_is_a_view_that_leaves_the_taskset_whole():
    taskset = tg.Taskset(id="t", data=ROWS)
    taskset.head(3)
    assert len(taskset) == 20


def test_head_longer_than_the_data_gives_all_of_it():
    assert len(tg.Taskset(id="t", data=ROWS).head(100)) == 20


def test_shuffle_with_the_same_seed_gives_the_same_order():
    taskset = tg.Taskset(id="t", data=ROWS)
    assert prompts(taskset.shuffle(seed=5)) == prompts(taskset.shuffle(seed=5))


def test_shuffle_with_different_seeds_gives_different_orders():
    taskset = tg.Taskset(id="t", data=ROWS)
    assert prompts(taskset.shuffle(seed=1)) != prompts(taskset.shuffle(seed=2))


def test_shuffle_is_a_permutation_of_the_tasks():
    taskset = tg.Taskset(id="t", data=ROWS)
    shuffled = prompts(taskset.shuffle(seed=1))
    assert shuffled != prompts(taskset) and sorted(shuffled) == sorted(prompts(taskset))


def test_head_after_shuffle_takes_the_first_of_the_shuffled_order():
    taskset = tg.Taskset(id="t", data=ROWS)
    assert prompts(taskset.shuffle(seed=3).head(4)) == prompts(taskset.shuffle(seed=3))[:4]


# --- infinite tasksets -----------------------------------------------------------------------------------
def test_infinite_taskset_is_unbounded_and_refuses_len():
    taskset = Counting()
    assert not taskset.bounded
    with pytest.raises(tg.UsageError, match=r"'counting' is infinite; bound it with head\(n\)"):
        len(taskset)


def test_head_bounds_an_infinite_taskset():
    taskset = Counting().head(5)
    assert taskset.bounded and len(taskset) == 5


def test_bounded_shuffle_of_an_infinite_taskset_permutes_its_first_n():
    shuffled = prompts(Counting().shuffle(seed=1, bound=6))
    assert sorted(shuffled) == sorted(f"q{i}" for i in range(6))
    assert shuffled == prompts(Counting().shuffle(seed=1, bound=6))


def test_shuffle_after_head_needs_no_bound():
    assert len(Counting().head(4).shuffle(seed=1)) == 4


# --- task keys and rows ----------------------------------------------------------------------------------
def test_same_content_gives_the_same_key():
    assert tg.TaskData(prompt="p", answer=1).key == tg.TaskData(prompt="p", answer=1).key


def test_different_content_gives_a_different_key():
    assert tg.TaskData(prompt="p", answer=1).key != tg.TaskData(prompt="p", answer=2).key


def test_given_id_is_the_key():
    assert tg.TaskData(prompt="p", id="task-7").key == "task-7"


def test_key_is_recorded_on_the_trace():
    data = tg.TaskData(prompt="p")
    assert tg.Trace(task=data).task_key == data.key


def test_task_data_is_immutable():
    data = tg.TaskData(prompt="p")
    with pytest.raises(Exception, match="frozen"):
        data.prompt = "q"


def test_identical_rows_are_distinct_tasks_keyed_by_position():
    taskset = tg.Taskset(id="t", data=[{"prompt": "same"}] * 4)
    assert [d.key for d in taskset] == ["0", "1", "2", "3"]


def test_a_key_given_by_the_taskset_wins_over_the_position():
    taskset = tg.Taskset(id="t", data=[{"prompt": "a", "id": "first"}, {"prompt": "a"}])
    assert [d.key for d in taskset] == ["first", "1"]


def test_shuffle_keeps_each_rows_key():
    for data in tg.Taskset(id="t", data=ROWS).shuffle(seed=3):
        assert data.key == str(data.answer)


def test_a_lazy_taskset_keys_rows_by_their_position_in_load_order():
    assert [d.key for d in Counting().shuffle(seed=1, bound=5)] == [str(d.answer) for d in
                                                                    Counting().shuffle(seed=1, bound=5)]
    assert [d.key for d in Counting().head(3)] == ["0", "1", "2"]


def test_keys_are_the_same_on_every_pass():
    taskset = tg.Taskset(id="t", data=[{"prompt": "same"}] * 3)
    assert [d.key for d in taskset] == [d.key for d in taskset]


def test_a_keyed_row_keeps_its_key_through_a_trace_on_disk():
    data = list(tg.Taskset(id="t", data=[{"prompt": "same"}] * 3))[2]
    back = tg.Trace.model_validate_json(tg.Trace(task=data).model_dump_json())
    assert back.task_key == "2" and back.task.key == "2"


def test_a_copy_with_another_id_has_that_key():
    data = tg.TaskData(prompt="p")
    assert data.key and data.model_copy(update={"id": "7"}).key == "7"


def test_rows_become_the_tasksets_data_class_with_its_fields():
    [data] = Targets(data=[{"prompt": "p", "target": 3}])
    assert isinstance(data, Target) and data.target == 3


def test_subclass_field_is_part_of_the_key():
    assert Target(prompt="p", target=1).key != Target(prompt="p", target=2).key


def test_subclass_row_read_back_as_plain_task_data_keeps_its_key():
    row = Target(prompt="p", target=3)
    plain = tg.TaskData.model_validate_json(row.model_dump_json())
    assert plain.key == row.key and Targets().as_data(plain) == row


def test_row_missing_a_field_is_named():
    with pytest.raises(tg.UsageError, match=r"taskset 'targets': bad task row: field 'target': Field required"):
        list(Targets(data=[{"prompt": "p"}]))


def test_row_with_a_wrong_type_is_named():
    with pytest.raises(tg.UsageError, match=r"bad task row: field 'target'.*got 'many'"):
        list(Targets(data=[{"prompt": "p", "target": "many"}]))


def test_row_without_a_prompt_is_named():
    with pytest.raises(tg.UsageError, match=r"field 'prompt'"):
        list(tg.Taskset(id="t", data=[{"answer": 1}]))


# --- lookup by index and key ----------------------------------------------------------------------------
def test_index_gives_the_row_at_that_position():
    assert tg.Taskset(id="t", data=ROWS)[3] == tg.TaskData(prompt="q3", answer=3, id="3")


def test_index_of_a_lazy_taskset_reads_only_the_rows_up_to_it():
    taskset = Lazy()
    assert taskset[4].prompt == "q4" and taskset.produced == 5


def test_index_of_an_infinite_taskset_reads_only_the_rows_up_to_it():
    taskset = Counting()
    assert taskset[6].key == "6" and taskset.produced == 7


def test_index_of_a_view_follows_the_views_order():
    shuffled = tg.Taskset(id="t", data=ROWS).shuffle(seed=2)
    assert shuffled[5] == list(shuffled)[5]


def test_negative_index_counts_from_the_end_of_a_bounded_taskset():
    assert tg.Taskset(id="t", data=ROWS)[-1].prompt == "q19"


def test_negative_index_of_an_infinite_taskset_is_a_usage_error():
    with pytest.raises(tg.UsageError, match=r"'counting' is infinite.*head\(n\)"):
        Counting()[-1]


def test_index_past_the_end_is_an_index_error_naming_the_size():
    with pytest.raises(IndexError, match=r"taskset 't' has 20 tasks; no index 20"):
        tg.Taskset(id="t", data=ROWS)[20]


def test_lookup_by_key_reads_only_the_rows_up_to_the_match():
    taskset = Lazy()
    assert taskset.row("3").prompt == "q3" and taskset.produced == 4


def test_lookup_by_a_given_id():
    taskset = tg.Taskset(id="t", data=[{"prompt": "a", "id": "alpha"}, {"prompt": "b", "id": "beta"}])
    assert taskset.row("beta").prompt == "b"


def test_lookup_of_a_missing_key_is_a_key_error_naming_it():
    with pytest.raises(KeyError, match=r"taskset 't' has no task with key 'nope'"):
        tg.Taskset(id="t", data=ROWS).row("nope")


def test_lookup_by_key_in_an_infinite_taskset_needs_a_bound():
    with pytest.raises(tg.UsageError, match=r"'counting' is infinite.*within="):
        Counting().row("3")


def test_lookup_by_key_in_an_infinite_taskset_searches_within_the_bound():
    taskset = Counting()
    assert taskset.row("3", within=10).prompt == "q3" and taskset.produced == 4
    with pytest.raises(KeyError, match=r"no task with key '30' in its first 10"):
        Counting().row("30", within=10)


# --- config ----------------------------------------------------------------------------------------------
def test_config_defaults_apply_when_none_is_given():
    taskset = Sized()
    assert taskset.config == Opts() and len(taskset) == 4


def test_config_mapping_is_validated_into_the_tasksets_config():
    taskset = Sized({"size": 2})
    assert isinstance(taskset.config, Opts) and len(taskset) == 2


def test_config_object_is_used_as_given():
    opts = Opts(size=1)
    assert Sized(opts).config is opts
