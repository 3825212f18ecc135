"""`tracegym view`: bad paths and flags are one line and exit 2; a run folder is served on loopback at the URL
it prints."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path

import aiohttp
import pytest

from tracegym.cli.main import main
from tracegym.cli.view import ViewArgs, parse, serve
from tracegym.core.episode import Episode
from tracegym.eval.run_folder import RunFolder
from tracegym.testing import make_trace
from tracegym.view.run_folder_index import RunFolderIndex


def eval_folder(root: Path) -> Path:
    """A finished eval run of three traces."""
    folder = RunFolder.create(root, "test", "fake-model", run_id="run")
    folder.write_config({"taskset": "test", "model": {"name": "fake-model"}})
    for i in range(3):
        folder.log.append(Episode.solo(make_trace(rollout_index=i)))
    folder.log.close()
    return folder.path


@pytest.mark.parametrize(("args", "said"), [
    (["{missing}"], "is not a run folder: no such directory"),
    (["{empty}"], "is not a run folder: it has no config.toml"),
    (["{file}"], "is not a run folder: a file, not a directory"),
    (["{run}", "--port", "http"], "--port 'http': a port is a whole number"),
    (["{run}", "--port"], "--port needs a value"),
    (["{run}", "--host", "0.0.0.0"], "add --allow-remote"),
    (["{run}", "--colour"], "unknown option '--colour'"),
    ([], "usage: tracegym view RUN_DIR"),
])
def test_bad_paths_and_flags_are_one_line_and_exit_2(tmp_path, capsys, args, said):
    (tmp_path / "empty").mkdir()
    (tmp_path / "traces.jsonl").write_text("")
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "run": tmp_path,
             "file": tmp_path / "traces.jsonl"}
    assert main(["view", *(a.format(**paths) for a in args)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


def test_a_remote_bind_is_allowed_only_when_asked(tmp_path):
    asked = parse([str(tmp_path), "--host", "0.0.0.0", "--allow-remote", "--port=0"])
    assert asked == ViewArgs(tmp_path, 0, "0.0.0.0", True)
    assert parse([str(tmp_path), "--host", "::1"]).host == "::1"
    assert parse([str(tmp_path)]).host == "127.0.0.1"


async def test_serves_the_run_on_loopback_at_the_printed_url(tmp_path, capsys):
    index = RunFolderIndex.open(eval_folder(tmp_path))
    task = asyncio.create_task(serve(index, ViewArgs(index.path, port=0)))
    try:
        url = await _printed_url(capsys)
        assert url.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as response:
                assert response.status == 200 and "summary" in (await response.text()).lower()
            async with session.get(url + "api/run") as response:
                assert (await response.json())["kind"] == "eval"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_port_in_use_is_a_usage_error(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = await asyncio.to_thread(main, ["view", str(eval_folder(tmp_path)), "--port", str(port)])
    assert code == 2
    assert f"--port {port}: the port is in use" in capsys.readouterr().err


async def _printed_url(capsys: pytest.CaptureFixture[str]) -> str:
    for _ in range(200):
        found = re.search(r"at (http://\S+/)", capsys.readouterr().out)
        if found:
            return found.group(1)
        await asyncio.sleep(0.05)
    raise AssertionError("tracegym view printed no URL")
