"""The teacher of an `opd` run: refused when it tokenizes differently from the student (a directory or an endpoint;
`tracegym rl` exits 2 naming `[teacher]`), a down endpoint stops scoring after bounded retries naming it, vLLM's
prompt-logprobs reply is read token by token, and a teacher directory is scored in process when asked."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.core.errors import InfrastructureError, ModelError, UsageError
from tracegym.models.embedded import embedded_model_dir
from tracegym.models.endpoint import Endpoint
from tracegym.testing.fake_server import FakeOpenAIServer
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints
from tracegym.train.teacher import (
    PROBE,
    TransformersTeacher,
    VLLMTeacher,
    build_teacher,
    check_teacher,
    prompt_logprobs,
)

CONFIG = Path(__file__).parents[2] / "configs" / "opd" / "reverse_text.toml"


def opd_config(scorer: str = "vllm", **teacher: object) -> RLConfig:
    return RLConfig.model_validate({"mode": "opd", "teacher": teacher, "opd": {"scorer": scorer},
                                    "trainer": {"model": str(embedded_model_dir())}})


def check(config: RLConfig) -> None:
    """`check_teacher` as `tracegym rl` calls it for an `opd` run."""
    assert config.teacher is not None
    check_teacher(config.teacher, config.opd.scorer, config.trainer.model, config.model.tokenizer)


@pytest.fixture(scope="module")
def other_tokenizer_dir(tmp_path_factory) -> Path:
    """The student's tokenizer with one token more: another vocabulary."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    tokenizer.add_tokens(["<opd-extra-token>"])
    path = tmp_path_factory.mktemp("other-tokenizer")
    tokenizer.save_pretrained(path)
    return path


def test_a_teacher_directory_with_the_students_tokenizer_passes():
    check(opd_config(name=str(embedded_model_dir())))


def test_a_teacher_directory_with_another_vocabulary_is_refused_naming_the_teacher(other_tokenizer_dir):
    with pytest.raises(UsageError, match=r"\[teacher\] name: .* another vocabulary than the student"):
        check(opd_config(name=str(other_tokenizer_dir)))


def test_tracegym_rl_exits_2_naming_the_teacher_when_its_tokenizer_differs(other_tokenizer_dir, tmp_path, capsys):
    code = main(["rl", "@", str(CONFIG), "--teacher.name", str(other_tokenizer_dir), "--output-dir", str(tmp_path)])
    assert code == 2
    assert "[teacher]" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before any run folder or process


def test_a_teacher_directory_without_a_tokenizer_is_refused_naming_it(tmp_path):
    with pytest.raises(UsageError, match=r"\[teacher\]: cannot load the tokenizer"):
        check(opd_config(name=str(tmp_path)))


def test_a_teacher_folder_that_does_not_exist_is_named_as_missing_not_as_a_bad_hub_id(tmp_path):
    with pytest.raises(UsageError, match=r"\[teacher\]: '.*/weights/merged' is no model folder"):
        check(opd_config(name=str(tmp_path / "run" / "weights" / "merged")))


def test_the_shipped_opd_config_dry_runs_on_a_fresh_clone_warning_of_its_missing_teacher(tmp_path, capsys,
                                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)  # a fresh clone: no RL run's weights under outputs/
    code = main(["rl", "@", str(CONFIG), "--dry-run", "--output-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0 and 'mode = "opd"' in out
    assert "warning: [teacher]: 'outputs/sft/reverse-text-recipe/weights/merged' is no model folder" in err


class Tokenizing(BaseHTTPRequestHandler):
    """A vLLM-like endpoint serving one model whose `/tokenize` gives `TOKENS` for any text."""

    TOKENS: list[int] = []

    def do_GET(self) -> None:
        self._json({"data": [{"id": "teacher"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._json({"tokens": self.TOKENS, "count": len(self.TOKENS)})

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def tokenizing_endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Tokenizing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_a_teacher_endpoint_tokenizing_like_the_student_passes(tokenizing_endpoint):
    from transformers import AutoTokenizer

    Tokenizing.TOKENS = AutoTokenizer.from_pretrained(embedded_model_dir()).encode(PROBE, add_special_tokens=False)
    check(opd_config(base_url=tokenizing_endpoint))


def test_a_teacher_endpoint_tokenizing_otherwise_is_refused_naming_it(tokenizing_endpoint):
    Tokenizing.TOKENS = [1, 2, 3]
    with pytest.raises(UsageError, match=r"the \[teacher\] endpoint http://127.0.0.1:\d+/v1 tokenizes differently"):
        check(opd_config(base_url=tokenizing_endpoint))


def test_a_teacher_endpoint_that_is_down_at_start_is_refused_naming_it():
    with FakeOpenAIServer() as server:
        url = server.base_url
    with pytest.raises(UsageError, match=rf"\[teacher\] base_url: {url} cannot tokenize"):
        check(opd_config(base_url=url, timeout=2.0))


async def test_a_teacher_endpoint_that_stays_down_stops_scoring_after_bounded_retries():
    with FakeOpenAIServer(fail_first=100) as server:
        endpoint = Endpoint(base_url=server.base_url, model="fake-model", api_key_env=None, max_retries=2,
                            backoff=0.01)
        teacher = VLLMTeacher(endpoint)
        with pytest.raises(InfrastructureError, match=rf"the \[teacher\] endpoint {server.base_url} is down"):
            await teacher.logprobs([1, 2, 3])
        await teacher.aclose()
        assert len(server.requests) == 3  # one try and two retries, then the stop


def test_prompt_logprobs_are_read_for_the_tokens_sent():
    reply = {"choices": [{"prompt_logprobs": [None, {"7": {"logprob": -1.5, "rank": 3}},
                                              {"9": {"logprob": -0.25, "rank": 1}, "4": {"logprob": -2.0}}]}]}
    assert prompt_logprobs(reply, [5, 7, 9]) == [-1.5, -0.25]


@pytest.mark.parametrize("reply", [{}, {"choices": [{"prompt_logprobs": None}]},
                                   {"choices": [{"prompt_logprobs": [None, {"8": {"logprob": -1.0}}]}]},
                                   {"choices": [{"prompt_logprobs": [None]}]}])
def test_a_reply_without_the_tokens_logprobs_is_a_model_error_naming_the_teacher(reply):
    with pytest.raises(ModelError, match=r"\[teacher\] endpoint's reply has no prompt logprobs"):
        prompt_logprobs(reply, [5, 7])


async def test_scorer_transformers_loads_the_teacher_directory_in_process():
    config = opd_config(scorer="transformers", name=str(embedded_model_dir()))
    teacher = build_teacher(config.teacher, config.opd.scorer,
                            Endpoints(base_url="http://127.0.0.1:9/v1", base_model="m", envs={}))
    assert isinstance(teacher, TransformersTeacher)
    scores = await teacher.logprobs([1, 330, 1303, 28])
    assert len(scores) == 3 and all(s < 0 for s in scores)


def test_an_endpoint_teacher_without_one_in_endpoints_json_is_a_usage_error():
    config = opd_config(name="some/dir")
    with pytest.raises(UsageError, match="names no teacher"):
        build_teacher(config.teacher, config.opd.scorer,
                      Endpoints(base_url="http://127.0.0.1:9/v1", base_model="m", envs={}))
