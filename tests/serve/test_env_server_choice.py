"""The env-server section eval and rl share: running servers by address, or the pool of one started here, given to
`tracegym serve` as its own flags; a contradictory pool is refused where it is written."""

import pytest
from pydantic import ValidationError

from tracegym.cli.serve import ServeConfig
from tracegym.serve.env_server_choice import EnvServerChoice, WorkerPoolChoice


def test_the_defaults_ask_serve_for_nothing_of_its_own():
    assert EnvServerChoice().serve_args() == []


def test_each_pool_option_set_becomes_the_serve_flag_of_the_same_name():
    choice = EnvServerChoice(elastic=True, max_workers=4, grow_at=16, idle_seconds=2, worker_timeout=7,
                             max_abandoned_threads=8)
    assert choice.serve_args() == ["--elastic", "--max-workers", "4", "--idle-seconds", "2.0", "--grow-at", "16.0",
                                   "--worker-timeout", "7.0", "--max-abandoned-threads", "8"]
    assert EnvServerChoice(workers=3).serve_args() == ["--workers", "3"]


def test_serve_declares_no_pool_option_of_its_own():
    """`tracegym serve` takes the pool options from the shared section: one declaration, one docstring each."""
    assert issubclass(ServeConfig, WorkerPoolChoice)
    assert not set(WorkerPoolChoice.model_fields) & set(ServeConfig.__annotations__)


def test_a_pool_gives_the_size_it_names():
    assert EnvServerChoice(workers=3).size().min == 3
    size = EnvServerChoice(elastic=True, max_workers=5, grow_at=2).size()
    assert size.elastic and (size.min, size.max, size.grow_at) == (1, 5, 2)


@pytest.mark.parametrize(("options", "named", "says"), [
    ({"workers": 2, "elastic": True}, "elastic", "give one or the other"),
    ({"grow_at": 3}, "grow_at", "set `elastic` too"),
    ({"max_workers": 3}, "max_workers", "set `elastic` too"),
    ({"address": "tcp://h:5555", "workers": 2}, "address", "`workers` (for one started here) has no effect"),
    ({"address": "tcp://h:5555", "worker_timeout": 9}, "address", "`worker_timeout`"),
])
def test_a_contradictory_choice_is_refused_at_its_key(options, named, says):
    with pytest.raises(ValidationError) as caught:
        EnvServerChoice(**options)
    [error] = caught.value.errors()
    assert error["loc"] == (named,) and says in error["msg"]


def test_a_saved_choice_with_its_defaults_written_out_validates_again():
    """A run folder's config has every default written out (an eval's `--resume` reads it back)."""
    saved = EnvServerChoice(address="tcp://h:5555").model_dump(mode="json")
    assert EnvServerChoice.model_validate(saved).address == ["tcp://h:5555"]


@pytest.mark.parametrize("options", [{}, {"elastic": True}])
def test_the_spare_workers_reach_the_pool_static_or_elastic(options):
    assert EnvServerChoice(**options).size().spares == 1
    choice = EnvServerChoice(spare_workers=0, **options)
    assert choice.size().spares == 0 and "--spare-workers" in choice.serve_args()


def test_the_byte_limits_are_refused_with_an_address_like_the_pool_options():
    with pytest.raises(ValidationError, match="`max_open_bytes`"):
        EnvServerChoice(address="tcp://h:5555", max_open_bytes="1GiB")
