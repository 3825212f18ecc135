"""Bad input to a command: one line naming the flag or file at fault, exit 2, and no run folder."""

import os
import subprocess

import pytest

from tracegym.cli.main import main
from tracegym.serve import local_server
from tracegym.serve.wire import SECRET_ENV
from tracegym.testing import FakeOpenAIServer


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer(rule=lambda request: "ok") as fake:
        yield fake


def refused(capsys, args: list[str]) -> str:
    """Run the command, assert it exits 2 with one line on stderr and no traceback; return that line."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("flags", "named"), [
    (["-n", "-3"], "--num-tasks"),
    (["-n", "0"], "--num-tasks"),
    (["-r", "0"], "--rollouts"),
    (["-r", "-2"], "--rollouts"),
    (["--num-tasks", "-1"], "--num-tasks"),
    (["--concurrency", "0"], "--concurrency"),
    (["--sampling.max-tokens", "0"], "--sampling.max-tokens"),
    (["--sampling.temperature", "-1"], "--sampling.temperature"),
    (["--sampling.top-p", "0"], "--sampling.top-p"),
    (["--timeouts.model", "-5"], "--timeouts.model"),
    (["--timeouts.rollout", "0"], "--timeouts.rollout"),
    (["--run-id", "../../../x"], "--run-id"),
    (["--run-id", ".."], "--run-id"),
])
def test_a_value_out_of_range_exits_2_naming_its_flag_and_makes_no_folder(flags, named, server, tmp_path, capsys):
    out = tmp_path / "out"
    err = refused(capsys, ["eval", "reverse-text", *flags, "--model.base-url", server.base_url,
                           "--output-dir", str(out)])
    assert named in err
    assert not out.exists()


def test_a_base_url_that_is_not_a_url_exits_2_naming_the_flag(tmp_path, capsys):
    out = tmp_path / "out"
    err = refused(capsys, ["eval", "reverse-text", "--base-url", "not-a-url", "--output-dir", str(out)])
    assert "--base-url: Value error, not an http(s) URL" in err and "not-a-url" in err  # as written, no list index
    assert not out.exists()


def test_a_misspelt_serve_flag_exits_2_suggesting_the_right_one(capsys):
    err = refused(capsys, ["serve", "reverse-text", "--worker", "2"])
    assert "--worker: unknown option; did you mean --workers?" in err


def test_a_taskset_file_with_a_syntax_error_exits_2_naming_the_file(server, tmp_path, capsys):
    bad = tmp_path / "syntax_error_tasks.py"
    bad.write_text("def broken(:\n")
    out = tmp_path / "out"
    err = refused(capsys, ["eval", f"{bad}:Tasks", "--model.base-url", server.base_url, "--output-dir", str(out)])
    assert "syntax_error_tasks.py" in err and "line 1" in err
    assert not out.exists()


def test_a_load_that_raises_exits_2_naming_the_taskset_and_makes_no_folder(server, tmp_path, capsys):
    bad = tmp_path / "failing_load_tasks.py"
    bad.write_text("import tracegym as tg\n\n\nclass Tasks(tg.Taskset):\n    def load(self):\n"
                   "        raise OSError('dataset.jsonl is missing')\n")
    out = tmp_path / "out"
    err = refused(capsys, ["eval", f"{bad}:Tasks", "--model.base-url", server.base_url, "--output-dir", str(out),
                           "--no-rich"])
    assert "failing_load_tasks.py:Tasks" in err and "OSError: dataset.jsonl is missing" in err
    assert not out.exists()


def test_a_load_that_raises_on_resume_exits_2_naming_the_taskset(server, tmp_path, capsys):
    tasks = tmp_path / "flaky_load_tasks.py"
    tasks.write_text("import os\nimport tracegym as tg\n\n\nclass Tasks(tg.Taskset):\n    def load(self):\n"
                     "        if os.environ.get('BREAK_LOAD'):\n            raise OSError('dataset.jsonl is missing')\n"
                     "        return [{'prompt': 'a'}]\n")
    out = tmp_path / "out"
    assert main(["eval", f"{tasks}:Tasks", "--model.base-url", server.base_url, "--output-dir", str(out), "--no-rich",
                 "--no-serve"]) == 0
    [run] = [p.parent for p in out.rglob("config.toml")]
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BREAK_LOAD", "1")
        err = refused(capsys, ["eval", "--resume", str(run)])
    assert "flaky_load_tasks.py:Tasks" in err and "OSError: dataset.jsonl is missing" in err


def test_a_failed_env_server_start_leaves_no_folder(server, tmp_path, capsys):
    """An env server address that answers nothing is a failed start: nothing is written."""
    out = tmp_path / "out"
    assert main(["eval", "reverse-text", "--model.base-url", server.base_url, "--output-dir", str(out),
                 "--env.address", "not-an-address"]) == 2
    assert "--env.address" in capsys.readouterr().err
    assert not out.exists()


def test_a_typo_in_an_eval_config_file_names_the_file_and_its_toml_key(tmp_path, capsys):
    config = tmp_path / "eval_typo.toml"
    config.write_text("[taskset]\nid = 'reverse-text'\n\n[sampling]\ntemprature = 0.5\n")
    out = tmp_path / "out"
    err = refused(capsys, ["eval", "@", str(config), "--output-dir", str(out)])
    assert f"{config}: [sampling] temprature: unknown key; did you mean [sampling] temperature?" in err
    assert not out.exists()


@pytest.mark.parametrize(("flags", "named"), [(["--workers", "0"], "--workers"), (["--address", "5555"], "--address")])
def test_a_bad_serve_option_exits_2_naming_it(flags, named, capsys):
    assert named in refused(capsys, ["serve", "reverse-text", *flags])


def test_an_eval_output_dir_that_cannot_be_made_exits_2_naming_the_flag(server, tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    err = refused(capsys, ["eval", "reverse-text", "-n", "1", "--model.base-url", server.base_url, "--no-serve",
                           "--output-dir", str(tmp_path / "a-file" / "out")])
    assert "--output-dir" in err and "a-file" in err


def test_an_rl_output_dir_that_cannot_be_made_exits_2_naming_the_flag(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    err = refused(capsys, ["rl", "--output-dir", str(tmp_path / "a-file" / "out")])
    assert "--output-dir" in err and "a-file" in err


def test_an_rl_env_address_without_a_transport_exits_2_naming_its_key(tmp_path, capsys):
    config = tmp_path / "rl.toml"
    config.write_text('[[orchestrator.train.envs]]\nid = "reverse-text"\naddress = "127.0.0.1:5555"\n')
    err = refused(capsys, ["rl", "@", str(config), "--dry-run"])
    assert "address" in err and "tcp://" in err


def test_an_rl_run_id_that_leaves_the_output_dir_exits_2_naming_the_flag(capsys):
    assert "--run-id" in refused(capsys, ["rl", "--run-id", "../elsewhere", "--dry-run"])


@pytest.mark.parametrize("value", ["0", "-1"])
def test_an_rl_concurrency_below_one_exits_2_naming_its_flag(value, capsys):
    err = refused(capsys, ["rl", "--orchestrator.concurrency", value, "--dry-run"])
    assert "--orchestrator.concurrency" in err


def test_checkpoint_every_zero_exits_2_naming_its_flag(capsys):
    assert "--checkpoint-every" in refused(capsys, ["rl", "--checkpoint-every", "0", "--dry-run"])


@pytest.mark.parametrize(("flag", "value"), [("--idle-seconds", "-1"), ("--worker-timeout", "0"),
                                             ("--grow-at", "0")])
def test_a_serve_number_out_of_range_exits_2_naming_its_flag(flag, value, capsys):
    err = refused(capsys, ["serve", "reverse-text", "--elastic", flag, value])
    assert flag in err


@pytest.mark.parametrize(("flags", "named", "says"), [
    (["--env.grow-at", "3"], "--env.grow-at", "set `elastic` too"),
    (["--env.workers", "2", "--env.elastic"], "--env.elastic", "give one or the other"),
    (["--env.workers", "0"], "--env.workers", "greater than 0"),
    (["--env.address", "tcp://127.0.0.1:5555", "--env.workers", "2"], "--env.address", "`workers`"),
])
def test_a_bad_eval_env_server_option_exits_2_naming_its_flag(flags, named, says, tmp_path, capsys):
    err = refused(capsys, ["eval", "reverse-text", *flags, "--output-dir", str(tmp_path / "out")])
    assert named in err and says in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("entry", "named"), [
    ("elastic = true\nworkers = 2", "[orchestrator.train.envs[0]] elastic"),
    ("grow_at = 3", "[orchestrator.train.envs[0]] grow_at"),
    ('address = "tcp://127.0.0.1:5555"\nworker_timeout = 9', "[orchestrator.train.envs[0]] address"),
])
def test_a_bad_rl_env_server_option_exits_2_naming_its_key(entry, named, tmp_path, capsys):
    config = tmp_path / "rl.toml"
    config.write_text(f'[[orchestrator.train.envs]]\nid = "reverse-text"\n{entry}\n')
    assert named in refused(capsys, ["rl", "@", str(config), "--dry-run"])


def test_a_wrong_shared_secret_is_reported_as_an_authentication_failure_not_a_task_error(tmp_path, capsys,
                                                                                       monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "s3cret-s3cret-s3cret")
    with local_server("reverse-text", workers=1) as address:
        monkeypatch.setenv(SECRET_ENV, "a-wrong-guess-of-it")
        err = refused(capsys, ["eval", "reverse-text", "--env.address", address, "--output-dir", str(tmp_path)])
    assert "handshake refused" in err and SECRET_ENV in err and "task error" not in err


def test_a_tokenizer_that_cannot_be_loaded_exits_2_naming_the_flag_before_any_folder(server, tmp_path, capsys):
    err = refused(capsys, ["eval", "reverse-text", "-n", "1", "--model.base-url", server.base_url, "--model.client",
                           "tokens", "--model.tokenizer", str(tmp_path / "no-such-model"), "--output-dir",
                           str(tmp_path / "out")])
    assert "--model.tokenizer" in err and "no-such-model" in err
    assert not (tmp_path / "out").exists()



def test_a_tokens_client_without_a_tokenizer_flag_exits_2_naming_the_flag_before_any_folder(server, tmp_path, capsys):
    err = refused(capsys, ["eval", "reverse-text", "-n", "1", "--model.base-url", server.base_url, "--model.client",
                           "tokens", "--output-dir", str(tmp_path / "out")])
    assert err.startswith("tracegym eval: --model.tokenizer 'fake-model': cannot load a tokenizer from it")
    assert not (tmp_path / "out").exists()


def test_a_model_endpoint_that_does_not_answer_exits_1_in_one_line_before_any_folder(tmp_path, capsys):
    url = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there
    assert main(["eval", "reverse-text", "--model.base-url", url, "--output-dir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert f"{url}/models is unreachable" in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_resume_of_a_folder_that_does_not_exist_exits_2_naming_it(tmp_path, capsys):
    err = refused(capsys, ["eval", "--resume", str(tmp_path / "no-such-run")])
    assert f"{str(tmp_path / 'no-such-run')!r} is not a run folder: no such directory" in err


@pytest.fixture
def tiny_disk(tmp_path):
    """A 96 KiB tmpfs: a run folder on it fills up after a few dozen rollouts."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_exits_1_in_one_line_and_keeps_what_was_written(server, tiny_disk, capsys):
    args = ["eval", "reverse-text", "-n", "400", "--model.base-url", server.base_url, "--no-serve", "--no-rich",
            "--output-dir", str(tiny_disk / "out")]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tracegym eval: the disk is full") and "--resume" in err and "\n" not in err
    [run] = list((tiny_disk / "out").glob("*/*"))
    assert (run / "config.toml").is_file() and (run / "traces.jsonl").stat().st_size > 0
