"""SFT: teacher traces filtered (threshold, best-of-n), rendered for the student with loss on assistant tokens only
(also when teacher and student templates differ), the cross-entropy loss, the SFT source's step and its stops."""

import asyncio
import itertools
import json
import math
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tracegym.core.episode import Episode
from tracegym.core.errors import ErrorKind, InfrastructureError, UsageError
from tracegym.core.messages import assistant, system, tool, user
from tracegym.core.trace import StopReason
from tracegym.envs.evaluate import run_rollout
from tracegym.envs.registry import load_taskset
from tracegym.models.embedded import embedded_model_dir
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import ChatMLRenderer, LibraryRenderer, renderer_for
from tracegym.models.token_client import TokenClient
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer, make_episode, make_trace, reply, tool_call
from tracegym.testing.oracle import oracle_server
from tracegym.train.lm_head import head_hits
from tracegym.train.loss import cross_entropy_loss, token_hits
from tracegym.train.regeneration import EmptyBatch
from tracegym.train.rl_config import RLConfig, parse_rl_args
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for
from tracegym.train.samples import trace_samples
from tracegym.train.sft import (
    SFTConfig,
    SFTSignal,
    branch_tokens,
    kept_traces,
    sft_samples,
)
from tracegym.train.signal import StepGroups
from tracegym.train.teacher import reach_teacher
from tracegym.train.trainer import sft_metrics


# --- the student's renderers ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol() -> ChatMLRenderer:
    transformers = pytest.importorskip("transformers")
    from tracegym.models.embedded import embedded_model_dir

    renderer = renderer_for(transformers.AutoTokenizer.from_pretrained(embedded_model_dir()))
    assert isinstance(renderer, ChatMLRenderer)
    return renderer


class ToyTemplate:
    """A `renderers`-package renderer of another chat format than ChatML: a message is its role id, one id per
    character of its content (a tool call as `\\x01name\\x02arguments`), then 0; the assistant's role id 9 is the
    generation prompt."""

    ROLES = {"system": 1, "user": 2, "tool": 4, "assistant": 9}

    def get_stop_token_ids(self) -> list[int]:
        return [0]

    def _ids(self, m: dict) -> list[int]:
        calls = "".join(f"\x01{c['function']['name']}\x02{c['function']['arguments']}" for c in m.get("tool_calls")
                        or [])
        return [self.ROLES[m["role"]], *map(ord, (m.get("content") or "") + calls), 0]

    def render_ids(self, messages, *, tools=None, add_generation_prompt=False) -> list[int]:
        ids = [t for m in messages for t in self._ids(m)]
        return [*ids, 9] if add_generation_prompt else ids

    def bridge_to_next_turn(self, prompt_ids, completion_ids, new_messages, *, tools=None):
        return SimpleNamespace(token_ids=[*prompt_ids, *completion_ids,
                                          *self.render_ids(new_messages, add_generation_prompt=True)])

    def parse_response(self, token_ids, *, tools=None, prompt_ids=None) -> SimpleNamespace:
        """Shaped like the package's ParsedResponse (content, reasoning, calls shaped like its ParsedToolCall)."""
        content, *calls = "".join(chr(t) for t in token_ids if t != 0).split("\x01")
        parsed = [SimpleNamespace(raw=c, name=c.split("\x02")[0], arguments=c.split("\x02")[1], id=None)
                  for c in calls]
        return SimpleNamespace(content=content, reasoning_content=None, tool_calls=parsed)


class ToyTokenizer:
    def decode(self, ids, skip_special_tokens=False) -> str:
        return "".join(chr(t) for t in ids)


@pytest.fixture(scope="module")
def toy() -> LibraryRenderer:
    renderer = LibraryRenderer(ToyTemplate(), ToyTokenizer())
    renderer.generation_prompt_ids = [9]  # type: ignore[attr-defined]  (how the fake server counts turns)
    return renderer


# --- masking ---------------------------------------------------------------------------------------------
CONVERSATION = [system("Use the tools."), user("2+3?"),
                assistant(None, [tool_call("add", {"a": 2, "b": 3}, id="call_1")]),
                tool("5", "call_1"), assistant("5")]


def test_loss_falls_on_the_assistant_tokens_only(smol):
    [(ids, mask)] = branch_tokens(CONVERSATION, smol)
    trained = smol.decode([t for t, m in zip(ids, mask, strict=True) if m])
    context = smol.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
    assert trained == call + "5<|im_end|>"
    assert "Use the tools." in context and "2+3?" in context and "<tool_response>\n5\n</tool_response>" in context
    assert "5<|im_end|>" not in context and "<tool_call>" not in context
    # the tokens are the student's whole conversation, as its template renders it
    assert ids == smol.render(CONVERSATION, add_generation_prompt=False)[: len(ids)]


def test_a_trace_gives_one_sample_per_branch_with_no_logprobs(smol):
    trace = make_trace("hello", "olleh")
    [sample] = sft_samples(trace, smol)
    assert sample.trace_id == trace.id and sample.reward == 1.0
    assert sample.logprobs == [0.0] * len(sample) and sample.temperature == 1.0
    assert smol.decode([t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]) == "olleh<|im_end|>"


def test_an_assistant_turn_shared_by_two_branches_carries_loss_once(smol):
    trace = make_trace("q", "first")
    trace.graph.add(user("again"))
    trace.graph.add(assistant("second"), sampled=True)
    trace.graph.add(user("other"), parent=1)  # a second branch after the first reply
    trace.graph.add(assistant("third"), sampled=True)
    samples = sft_samples(trace, smol)
    trained = [smol.decode([t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m]) for s in samples]
    assert trained == ["first<|im_end|>second<|im_end|>", "third<|im_end|>"]


# --- two templates: the teacher's is never the student's --------------------------------------------------
CALC_SCRIPT = [reply(None, tool_call("add", {"a": 2, "b": 3})), "The result is 5"]


def rollout(endpoint: Endpoint | TokenClient):
    taskset = load_taskset("tool-calculator", {"seed": 0})

    async def run():
        try:
            return await run_rollout(taskset, next(iter(taskset)), endpoint)
        finally:
            if isinstance(endpoint, TokenClient):
                await endpoint.aclose()

    return taskset, asyncio.run(run())


@pytest.mark.parametrize("student", ["smol", "toy"])
def test_a_teacher_of_another_template_gives_the_students_own_tokens(student, request):
    """The teacher (its own toy template, token ids in its own vocabulary, reached through the chat client) and
    the student, a renderer of another format, play the same two-turn tool conversation; the SFT samples of the
    teacher's trace are exactly the samples of the student's own rollout of it (tokens and loss mask)."""
    renderer = request.getfixturevalue(student)
    with FakeOpenAIServer(CALC_SCRIPT, token_fields=True) as teacher:
        taskset, taught = rollout(Endpoint(base_url=teacher.base_url, model="fake-model", api_key_env=None))
    with FakeOpenAIServer(CALC_SCRIPT, renderer=renderer) as served:
        client = TokenClient(Endpoint(base_url=served.base_url, model="fake-model", api_key_env=None), renderer)
        _, own = rollout(client)
    assert taught.num_turns == own.num_turns == 2 and taught.reward == own.reward
    teacher_ids = [t for n in taught.graph.nodes for t in n.token_ids or []]
    assert teacher_ids  # the teacher sent its own ids, which the student's samples never use
    [expected] = trace_samples(own)
    [sample] = sft_samples(taught, renderer, taskset.task(taught.task).tool_specs())
    assert sample.token_ids == expected.token_ids
    assert sample.loss_mask == expected.loss_mask


# --- filters ---------------------------------------------------------------------------------------------
def group(*rewards: float | None):
    return [make_trace(reply=f"r{i}", reward=r, rollout_index=i) for i, r in enumerate(rewards)]


def solo_group(*rewards: float | None):
    """A teacher's group as the env server returns it: each rollout its solo episode."""
    return [Episode.solo(t) for t in group(*rewards)]


def test_the_reward_threshold_drops_what_is_below_it():
    kept, dropped = kept_traces(group(1.0, 0.5, 0.9, None), SFTConfig(min_reward=0.9))
    assert [t.rollout_index for t in kept] == [0, 2]
    assert dropped["below_min_reward"] == 1 and sum(dropped.values()) == 2  # and the unscored one


def test_best_of_n_keeps_the_highest_rewards_per_task():
    kept, dropped = kept_traces(group(0.2, 0.9, 0.5, 0.9), SFTConfig(keep_best=2))
    assert [t.rollout_index for t in kept] == [1, 3]  # ties in rollout order
    assert dropped == {"not_best": 2}


def test_truncated_and_failed_teacher_rollouts_are_dropped():
    cut = make_trace(stop_reason=StopReason.TRUNCATED)
    failed = make_trace(reward=None, error=ErrorKind.INFRASTRUCTURE)
    kept, dropped = kept_traces([cut, failed, make_trace()], SFTConfig())
    assert len(kept) == 1 and dropped["truncated"] == 1 and sum(dropped.values()) == 2
    assert len(kept_traces([cut], SFTConfig(keep_truncated=True))[0]) == 1


# --- the signal: a step's batch, and its stops -------------------------------------------------------------
def test_a_step_where_every_rollout_is_filtered_out_is_empty_and_says_which_keys_to_loosen(smol):
    source = SFTSignal(Endpoint(base_url="http://teacher:1/v1", model="t"), smol, SFTConfig(min_reward=1.0))
    samples, figures = asyncio.run(source.samples(StepGroups(0, [solo_group(0.5, 0.2)]), version=2))
    assert samples == [] and figures["sft/dropped/below_min_reward"] == 2
    why = source.why_empty([figures, figures])
    assert why == ("every teacher rollout was filtered out (4 below_min_reward); lower [sft] min_reward (now 1.0), "
                   "set [sft] keep_truncated, or check the teacher at http://teacher:1/v1")


def test_an_sft_run_whose_teacher_is_always_wrong_stops_after_its_attempts(tmp_path, smol):
    """Through the orchestrator and a real env server: each empty step is made again with new tasks, then the run
    stops (EmptyBatch) naming the [sft] keys."""
    config = RLConfig.model_validate({
        "mode": "sft", "model": {"client": "chat"}, "trainer": {"model": str(embedded_model_dir())},
        "teacher": {"base_url": "http://127.0.0.1:1/v1"}, "sft": {"min_reward": 1.0},
        "orchestrator": {"tasks_per_step": 2, "group_size": 2, "batch_attempts": 2,
                         "train": {"envs": [{"id": "reverse-text", "options": {"reward": "exact"}}]}}})
    with FakeOpenAIServer(rule=lambda request: "not the reversal") as teacher, \
            local_server("reverse-text", {"reward": "exact"}, workers=1) as env:
        endpoints = Endpoints(base_url="http://127.0.0.1:1/v1", base_model="m", envs={"reverse-text": env},
                              teacher_base_url=[teacher.base_url], teacher_model="fake-model")
        orchestrator = orchestrator_for(config, RLFolder(tmp_path), endpoints)

        async def make():
            try:
                return await orchestrator.make_batch(0, 0, "m")
            finally:
                await orchestrator.aclose()

        with pytest.raises(EmptyBatch, match=r"step 0: nothing to train on after 2 attempts: every teacher rollout "
                                             r"was filtered out \(8 below_min_reward\); lower \[sft\] min_reward"):
            asyncio.run(make())
    empties = [r for r in RLFolder(tmp_path).metrics.read() if "empty_batch" in r]
    assert [r["attempt"] for r in empties] == [0, 1]


def test_a_step_batch_is_stamped_and_counted(smol):
    source = SFTSignal(Endpoint(base_url="http://teacher:1/v1", model="t"), smol, SFTConfig(keep_best=1))
    samples, figures = asyncio.run(source.samples(StepGroups(0, [solo_group(0.2, 0.9)]), version=4))
    assert len(samples) == 1 and samples[0].policy_version == 4 and samples[0].reward == 0.9
    assert figures == {"sft/kept": 1, "sft/kept_rate": 0.5, "sft/dropped/not_best": 1}


def test_a_step_of_a_multi_agent_environment_is_refused_by_name(smol):
    source = SFTSignal(Endpoint(base_url="http://teacher:1/v1", model="t"), smol, SFTConfig())
    with pytest.raises(UsageError, match="mode = 'sft' trains on single-agent environments"):
        asyncio.run(source.samples(StepGroups(0, [[make_episode({"p0": 1.0, "p1": -1.0})]]), version=0))


def test_a_teacher_that_is_down_is_retried_then_named():
    config = RLConfig.model_validate({"mode": "sft", "teacher": {"base_url": "http://127.0.0.1:9/v1",
                                                                  "max_retries": 2}, "trainer": {"model": "m"}})
    waits: list[float] = []
    endpoints = Endpoints(base_url="http://x/v1", base_model="m", envs={}, teacher_base_url=["http://127.0.0.1:9/v1"])
    with pytest.raises(InfrastructureError, match=r"the teacher at http://127.0.0.1:9/v1 \(\[teacher\] base_url\) "
                                                  r"did not answer after 3 tries"):
        reach_teacher(config.teacher, endpoints, sleep=waits.append)
    assert len(waits) == 2


def test_the_teacher_model_is_the_one_its_endpoint_lists():
    with oracle_server("reverse-text", model="the-oracle") as server:
        endpoints = Endpoints(base_url="http://x/v1", base_model="m", envs={}, teacher_base_url=[server.base_url])
        teacher = RLConfig.model_validate({"mode": "sft", "teacher": {"base_url": server.base_url},
                                           "trainer": {"model": "m"}}).teacher
        endpoint = reach_teacher(teacher, endpoints)
    assert endpoint.model == "the-oracle" and endpoint.client == "chat" and endpoint.base_url == server.base_url


# --- config ----------------------------------------------------------------------------------------------
def test_the_mode_chooses_the_trainers_objective():
    sft = RLConfig.model_validate({"mode": "sft", "teacher": {"base_url": "http://t/v1"}, "trainer": {"model": "m"}})
    assert sft.trainer.objective == "cross_entropy"
    assert RLConfig.model_validate({"trainer": {"model": "m"}}).trainer.objective == "policy_gradient"
    with pytest.raises(ValueError, match=r"trainer\.objective = 'cross_entropy' does not fit mode = 'rl'"):
        RLConfig.model_validate({"trainer": {"model": "m", "objective": "cross_entropy"}})


def test_the_shipped_sft_config_resolves():
    path = Path(__file__).parents[2] / "configs" / "sft" / "reverse_text_teacher.toml"
    config = RLConfig.model_validate(tomllib.loads(path.read_text()))
    assert config.mode == "sft" and config.sft.min_reward == 1.0 and config.trainer.objective == "cross_entropy"
    assert config.orchestrator.eval.envs[0].options["reward"] == "exact"


# --- the loss --------------------------------------------------------------------------------------------
def test_cross_entropy_is_the_mean_nll_of_the_loss_tokens_over_the_step():
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25), -9.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    loss, stats = cross_entropy_loss(logprobs, mask, num_tokens=4)
    assert loss.item() == pytest.approx((math.log(2) + math.log(4)) / 4)
    assert stats == {"tokens": 2.0}
    loss.backward()
    assert logprobs.grad.tolist() == [[-0.25, -0.25, 0.0]]


def test_the_oracle_answers_known_tasks_and_refuses_others():
    taskset = load_taskset("reverse-text", {"seed": 0})
    with oracle_server("reverse-text", [{"seed": 0}]) as server:
        endpoint = Endpoint(base_url=server.base_url, model="oracle", api_key_env=None)
        good = asyncio.run(run_rollout(taskset, next(iter(taskset)), endpoint))
        other = load_taskset("reverse-text", {"seed": 99})
        bad = asyncio.run(run_rollout(other, next(iter(other)), endpoint))
    assert good.reward == 1.0 and good.last_reply == next(iter(taskset)).answer
    assert bad.errors and "404" in bad.errors[0].message and json.dumps(bad.errors[0].message)


def test_the_oracle_tells_image_tasks_with_the_same_text_apart_by_their_pictures():
    taskset = load_taskset("colour-codeword", {"seed": 0, "colours": 4})
    tasks = list(itertools.islice(taskset, 8))
    assert len({t.answer for t in tasks}) > 1 and len({tuple(m.text for m in t.initial_messages()) for t in tasks}) == 1
    with oracle_server("colour-codeword", [{"seed": 0, "colours": 4}], max_tasks=8) as server:
        endpoint = Endpoint(base_url=server.base_url, model="oracle", api_key_env=None)
        traces = [asyncio.run(run_rollout(taskset, task, endpoint)) for task in tasks]
    assert [t.last_reply for t in traces] == [t.answer for t in tasks]


def test_the_oracle_refuses_a_taskset_whose_tasks_open_alike_with_different_answers(tmp_path):
    (tmp_path / "twins.py").write_text(
        "import tracegym as tg\n\nclass Twins(tg.Taskset):\n    id = 'twins'\n\n    def load(self):\n"
        "        return [{'prompt': 'p', 'answer': 'a'}, {'prompt': 'p', 'answer': 'b'}]\n")
    with pytest.raises(UsageError, match=r"same messages but have different answers \('a', 'b'\)"):
        oracle_server(f"{tmp_path / 'twins.py'}:Twins")


def test_sft_on_a_multi_agent_taskset_is_refused_at_the_command_line_naming_the_flag():
    with pytest.raises(UsageError, match=r"--orchestrator\.train\.envs\.0: taskset 'kuhn-poker' is multi-agent; "
                                         r"mode = 'sft' trains on single-agent environments"):
        parse_rl_args(["@", "configs/sft/reverse_text_teacher.toml", "--orchestrator.train.envs",
                       '[{"id": "kuhn-poker"}]', "--dry-run"])


def test_a_cross_entropy_step_logs_its_perplexity_and_no_ratio_figures():
    rl_figures = {"loss": math.log(4), "grad_norm": 1.0, "tokens": 8.0, "masked_low_frac": 0.0, "masked_high_frac": 0.0,
                  "ratio_mean": 0.0, "abs_log_ratio_mean": 0.0, "samples": 2.0}
    assert sft_metrics(rl_figures) == {"loss": math.log(4), "grad_norm": 1.0, "tokens": 8.0, "samples": 2.0,
                                       "perplexity": pytest.approx(4.0)}


def test_cross_entropy_counts_the_loss_tokens_that_are_the_most_likely_token():
    hits = torch.tensor([[True, False, True]])
    _, stats = cross_entropy_loss(torch.zeros(1, 3), torch.tensor([[True, True, False]]), hits=hits)
    assert stats == {"tokens": 2.0, "correct": 1.0}


def test_token_hits_from_the_hidden_states_match_those_from_the_logits():
    generator = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(2, 5, 8, generator=generator), torch.randn(11, 8, generator=generator)
    sources = torch.tensor([[0, 1, 2], [3, 4, 4]])
    logits = hidden @ weight.T
    targets = torch.stack([logits[0, 0].argmax(), torch.tensor(3), logits[0, 2].argmax(), torch.tensor(0),
                           logits[1, 4].argmax(), torch.tensor(5)]).view(2, 3)
    expected = token_hits(logits, sources, targets)
    assert head_hits(hidden, weight, sources, targets).equal(expected)
    assert expected[0, 0] and expected[0, 2] and expected[1, 1]


def test_a_cross_entropy_step_logs_its_token_accuracy():
    figures = {"loss": 1.0, "grad_norm": 1.0, "tokens": 8.0, "token_accuracy": 0.75}
    assert sft_metrics(figures)["token_accuracy"] == 0.75
