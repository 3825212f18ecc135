"""Slow: an agent program streams through the proxy from a real vLLM serving the embedded model, with the token
client and with the chat client: the program reads the reply in several chunks and assembles what the trace
records, and the trace holds the tokens, logprobs and finish reasons the same calls record unstreamed."""

import openai
import pytest

from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.token_check import validate_tokens
from tracegym.core.trace import Trace
from tracegym.envs.proxy import InterceptionProxy
from tracegym.envs.rollout import Rollout, Timeouts
from tracegym.envs.task import Task
from tracegym.models.chat_client import ChatClient
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import load_renderer
from tracegym.models.token_client import TokenClient
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    config = VLLMServerConfig(model=str(embedded_model_dir()), served_model_name=SERVED_MODEL_NAME,
                              max_model_len=1024, log_path=tmp_path_factory.mktemp("vllm") / "vllm.log")
    with VLLMServer(config) as server:
        yield server.base_url


def a_client(base_url: str, kind: str):
    endpoint = Endpoint(base_url=base_url, model=SERVED_MODEL_NAME, api_key_env=None, tokens="on")
    return TokenClient(endpoint, load_renderer(str(embedded_model_dir()))) if kind == "tokens" else ChatClient(endpoint)


async def two_calls(base_url: str, kind: str, stream: bool) -> tuple[Rollout, list[tuple[str, str, int]]]:
    """A conversation of two calls; per call, the text the program assembled, the finish reason it read and the
    number of chunks that carried content."""
    client = a_client(base_url, kind)
    task = Task(TaskData(prompt="foxes"))
    rollout = Rollout(task, client, Sampling(max_tokens=24, temperature=1.0, seed=11), Timeouts(),
                      Trace(task=task.data, model=client.name))
    read = []
    async with InterceptionProxy.shared().lease(rollout) as lease:
        program = openai.AsyncOpenAI(base_url=lease.base_url, api_key="k", max_retries=0)
        history = [{"role": "user", "content": "Tell me about foxes."}]
        for _ in range(2):
            if stream:
                chunks = [c async for c in await program.chat.completions.create(model="m", messages=history,
                                                                                  stream=True)]
                pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
                finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
                read.append(("".join(pieces), finish, len(pieces)))
            else:
                answer = await program.chat.completions.create(model="m", messages=history)
                read.append((answer.choices[0].message.content or "", answer.choices[0].finish_reason, 1))
            history += [{"role": "assistant", "content": read[-1][0]}, {"role": "user", "content": "And then?"}]
        await program.close()
    await client.aclose()
    return rollout, read


@pytest.mark.parametrize("kind", ["tokens", "chat"])
async def test_a_streamed_conversation_through_the_proxy_records_what_it_records_unstreamed(base_url, kind):
    # vLLM's prefix cache: a prompt computed fresh and the same prompt read from cached blocks round differently in
    # bfloat16 on an AMX CPU (up to 0.12 nats apart, same tokens), so both measured conversations start from the
    # cache this one leaves
    await two_calls(base_url, kind, stream=False)
    streamed, read = await two_calls(base_url, kind, stream=True)
    unstreamed, read_whole = await two_calls(base_url, kind, stream=False)
    turns = [n for n in streamed.trace.graph.nodes if n.sampled]
    whole = [n for n in unstreamed.trace.graph.nodes if n.sampled]
    assert not streamed.trace.errors and validate_tokens(streamed.trace) == []
    assert len(turns) == 2 and len(streamed.trace.graph.branches()) == 1
    assert [(text, finish) for text, finish, _ in read] == [(n.message.text, f) for n, (_, f, _) in
                                                           zip(turns, read_whole, strict=True)]
    assert all(chunks > 1 for _, _, chunks in read)  # streamed as it was sampled, not in one piece
    assert [n.token_ids for n in turns] == [n.token_ids for n in whole]
    assert [n.mask for n in turns] == [n.mask for n in whole]
    for node, other in zip(turns, whole, strict=True):
        assert node.logprobs == pytest.approx(other.logprobs, abs=1e-4)
    assert streamed.trace.usage == unstreamed.trace.usage
