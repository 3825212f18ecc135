"""An rl environment entry names its env server's worker pool, runtime and harness (prime-rl's per-env
`EnvConfig`), and the launcher starts that server with them."""

import asyncio
import contextlib
import io

from tracegym.serve.env_client import EnvClient
from tracegym.train.launcher import start_env_servers
from tracegym.train.rl_config import env_servers, parse_rl_args


async def server_info(addresses: list[str]) -> dict:
    async with EnvClient(addresses) as client:
        return await client.info()


def test_an_environment_entrys_pool_runtime_and_harness_reach_the_env_server_the_launcher_starts(tmp_path):
    config = tmp_path / "rl.toml"
    config.write_text('[[orchestrator.train.env]]\nid = "reverse-text"\nelastic = true\nmax_workers = 2\n'
                      'runtime = "process-group"\nharness = { command = ["my-agent", "{prompt}"] }\n[trainer]\n')
    parsed, _ = parse_rl_args(["@", str(config)])
    with contextlib.ExitStack() as stack:
        addresses = start_env_servers(env_servers(parsed.orchestrator), tmp_path, stack, io.StringIO())
        info = asyncio.run(server_info(addresses["reverse-text"]))
    assert info["elastic"] is True and info["max_workers"] == 2  # and it took --runtime and --harness.* (or exited)
