"""TRL 1.16's asynchronous GRPO (`trl.experimental.async_grpo`) with a tracegym taskset: its own rollout worker spawns
a process, unpickles the adapter's environment class and reward functions there, generates against a vLLM-shaped
server (the fake OpenAI server speaking vLLM's token `/v1/completions` with the embedded SmolLM2's tokens) and scores
each rollout with the taskset's own reward, checked against tracegym's own evaluation of the same replies. The
whole trainer, update steps included, runs in `test_trl_async_grpo_train.py`."""

import asyncio
import os

import pytest

import tracegym as tg
from tracegym.interop.trl import environment_factory, reward_functions, train_dataset
from tracegym.models.embedded import embedded_model_dir
from tracegym.models.renderer import renderer_for
from tracegym.testing import FakeOpenAIServer, ScriptedModel

pytestmark = pytest.mark.slow
REPLY = "olleh"


def test_trls_async_rollout_worker_scores_the_pickled_class_and_reward_functions_in_its_own_process():
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from accelerate import PartialState
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker

    PartialState(cpu=True)  # the worker logs through accelerate
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    renderer = renderer_for(AutoTokenizer.from_pretrained(embedded_model_dir()))
    tokenizer.chat_template = qwen2_5_chat_template  # as test_trl_grpo_step: SmolLM2's template drops tool calls
    taskset = tg.load_taskset("reverse-text")
    with FakeOpenAIServer([REPLY], renderer=renderer) as server:
        worker = AsyncRolloutWorker(
            model_name="fake-model", dataset=train_dataset(taskset, num_tasks=2),
            reward_funcs=reward_functions(taskset), environment_factory=environment_factory(taskset),
            processing_class=tokenizer, eos_token_ids=[tokenizer.eos_token_id], num_generations=2,
            vllm_server_url=server.base_url.removesuffix("/v1"), max_tokens=8, max_tool_calling_iterations=1)
        worker.start()
        try:
            samples = [worker.rollout_buffer.get(timeout=300) for _ in range(4)]
        finally:
            worker.stop()
    own = asyncio.run(tg.evaluate(taskset.head(2), ScriptedModel([REPLY])))
    expected = {trace.prompt[-1].text: trace.rewards["lcs"].score for trace in own}
    assert [s.completion for s in samples] == [[{"role": "assistant", "content": REPLY}]] * 4
    assert [s.metrics["rewards/lcs"] for s in samples] == [expected[s.prompt[-1]["content"]] for s in samples]
