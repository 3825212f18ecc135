"""An env server gives its taskset's rows by position and says what it serves (size, seats, defaults), so a client
draws tasks without the taskset's code; a bad request is answered with an error naming what is wrong."""

import asyncio

import pytest
from serve_helpers import running_server

import tracegym as tg
from tracegym.serve import EnvClient
from tracegym.serve.env_client import describe
from tracegym.serve.wire import RemoteError


async def rows_of(server, indices):
    async with EnvClient(server.bound) as client:
        return await client.rows(indices)


def test_rows_come_by_position_in_the_order_asked():
    with running_server(spec="reverse-text", options={"num_tasks": 5}) as server:
        rows = asyncio.run(rows_of(server, [3, 0, 3]))
        expected = list(tg.load_taskset("reverse-text", {"num_tasks": 5}))
    assert [r.key for r in rows] == [expected[3].key, expected[0].key, expected[3].key]
    assert rows[1].prompt == expected[0].prompt and rows[1].answer == expected[0].answer


def test_a_position_past_the_end_is_refused_naming_the_size_and_the_server_goes_on():
    with running_server(spec="reverse-text", options={"num_tasks": 5}) as server:
        with pytest.raises(RemoteError, match="has 5 rows; no position 9"):
            asyncio.run(rows_of(server, [9]))
        assert len(asyncio.run(rows_of(server, [4]))) == 1


@pytest.mark.parametrize("payload", [{"indices": [-1]}, {"indices": "0"}, {"indices": [True]}, {}, [1, 2]])
def test_a_malformed_rows_request_is_a_bad_request_naming_indices(payload):
    async def ask(server):
        async with EnvClient(server.bound) as client:
            return await client.request("rows", payload)

    with running_server(spec="reverse-text") as server, \
            pytest.raises(RemoteError, match="BadRequest: rows: `indices` must be a list"):
        asyncio.run(ask(server))


def test_info_says_the_size_the_seats_and_the_defaults():
    with running_server(spec="kuhn-poker", options={"num_tasks": 7}) as server:
        served = describe(server.bound)
    assert (served.id, served.size, served.members) == ("kuhn-poker", 7, ["player_0", "player_1"])
    assert served.config["num_tasks"] == 7 and served.named("kuhn-poker")


def test_an_endless_taskset_has_no_size_and_gives_rows_as_far_as_asked():
    with running_server(spec="arithmetic") as server:
        served = describe(server.bound)
        rows = asyncio.run(rows_of(server, [2, 0]))
    assert served.size is None and len(rows) == 2 and rows[0].key != rows[1].key
