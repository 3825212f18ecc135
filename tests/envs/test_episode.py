"""The episode driver: views and the prefix invariant, atomic simultaneous slots, the private channel, quarantine of
malformed markup, stop conditions and bad input, on scripted models."""

import asyncio
import itertools
import random

import pytest

import tracegym as tg
from tracegym.core.episode import SOLO, Episode, Outcome
from tracegym.core.errors import ContextLengthError, FailureKind, InfrastructureError, UsageError
from tracegym.envs.episode import play
from tracegym.envs.evaluate import evaluate_episodes, run_episode
from tracegym.envs.multi_agent import InvalidMove, MultiAgentTask, VerdictError, verdict
from tracegym.envs.schedule import Member, Slot
from tracegym.envs.seats import Seat
from tracegym.models.endpoint import Endpoint
from tracegym.testing import Fail, ScriptedModel
from tracegym.train.samples import trace_samples, validate

ROW = {"prompt": "Begin.", "id": "r0"}


def speaker(request) -> str:
    """The member a request is for, read from its system prompt (`You are NAME.`)."""
    return request.messages[0].text.split()[2].rstrip(".")


def turn_of(request) -> int:
    return sum(m.role == "assistant" for m in request.messages)


class Chat(MultiAgentTask):
    """Three members, two rounds: a, then b and c at once; records every committed move."""

    seats = (Member(id="a", system_prompt="You are a."), Member(id="b", system_prompt="You are b."),
             Member(id="c", system_prompt="You are c."))

    def __init__(self, data, **options):
        super().__init__(data, **options)
        self.applied: list[tuple[str, str]] = []

    def schedule(self):
        for _ in range(2):
            yield Slot("a")
            yield Slot("b", "c")

    def act(self, member, move):
        self.applied.append((member, move))

    @tg.reward
    def spoke(self, trace):
        return float(len([m for m in trace.messages if m.role == "assistant"]))


def _taskset(task_class):
    class Set(tg.Taskset):
        id = "chat"

    Set.task_class = task_class
    return Set(data=[ROW])


def said(request) -> str:
    return f"<think>secret-{speaker(request)}-{turn_of(request)}</think>{speaker(request)} says {turn_of(request)}"


async def test_each_member_sees_own_turns_as_assistant_and_others_public_output_attributed():
    model = ScriptedModel(rule=said, tokens=True)
    [episode] = await evaluate_episodes(_taskset(Chat), model)
    assert episode.ok and episode.stop_reason == tg.StopReason.COMPLETED
    b = episode.traces["b"].messages
    assert [m.role for m in b] == ["system", "user", "user", "assistant", "user", "user", "assistant"]
    assert b[2].text == "[a] a says 0" and b[2].name == "a"
    assert b[3].text == "<think>secret-b-0</think>b says 0"  # its own turn, exactly as sampled
    assert b[4].text == "[c] c says 0" and b[5].text == "[a] a says 1"  # c acted with b: seen only after the slot
    assert episode.rewards == {"a": 2.0, "b": 2.0, "c": 2.0}
    assert all(t.member == m and t.episode_id == episode.id for m, t in episode.traces.items())


async def test_a_members_prompt_extends_its_previous_prompt_exactly_messages_and_tokens():
    model = ScriptedModel(rule=said, tokens=True)
    episode = await run_episode(_taskset(Chat), _taskset(Chat)[0], model)
    for member in episode.members:
        asked = [r for r in model.requests if speaker(r) == member]
        for before, after in itertools.pairwise(asked):
            reply = next(n.message for n in episode.traces[member].graph.nodes
                         if n.sampled and n.message.text.endswith(f"says {turn_of(before)}"))
            assert after.messages[: len(before.messages) + 1] == [*before.messages, reply]
            assert after.prefix is not None  # the token client would extend the branch's exact tokens
        trace = episode.traces[member]
        assert len(trace.branches) == 1  # every prompt extended the branch's tokens: the graph never forked
        assert validate(trace) == []  # exact tokens: trainable as they are


async def test_every_members_model_calls_carry_the_episode_id_as_their_session():
    model = ScriptedModel(rule=said, tokens=True)
    episode = await run_episode(_taskset(Chat), _taskset(Chat)[0], model)
    assert {r.session for r in model.requests} == {episode.id}  # a router keeps the whole episode on one server


async def test_a_simultaneous_slot_commits_all_its_moves_or_none():
    def rule(request):
        if speaker(request) == "c" and turn_of(request) == 1:
            return Fail(400, "c's call failed")
        return said(request)

    taskset = _taskset(Chat)
    task = taskset.task(taskset[0])
    episode = await play(task, {m: ScriptedModel(rule=rule, tokens=True) for m in task.members})
    assert [m for m, _ in task.applied] == ["a", "b", "c", "a"]  # slot 4 (b and c) applied nothing
    assert episode.error is not None and episode.error.stage.startswith("c:model")
    assert episode.stop_reason == tg.StopReason.ERROR and episode.rewards == {"a": None, "b": None, "c": None}
    b_said_again = "b says 1"
    assert b_said_again in episode.traces["b"].messages[-1].text  # b's own reply stays on its trace, as sampled
    assert not any(b_said_again in m.text for m in episode.traces["a"].messages)  # never reached another view
    assert all(t.stop_reason == tg.StopReason.ERROR for t in episode.traces.values())



class Held:
    """A model client whose calls wait on an event nobody sets: it records that a call started, and whether the
    call was cancelled (the only way it can end)."""

    name = "held"

    def __init__(self):
        self.started, self.cancelled = asyncio.Event(), asyncio.Event()

    async def aclose(self):
        pass

    async def complete(self, request):
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable: the event is never set")


def failing_after(*waits: asyncio.Event) -> ScriptedModel:
    """c's model: its first call waits until every event in `waits` is set (the peers' calls are in flight),
    then fails as an endpoint that is down."""
    model = ScriptedModel(rule=said)

    async def complete(request, inner=model.complete):
        for event in waits:
            await event.wait()
        raise InfrastructureError("HTTP 503: c's endpoint is down")

    model.complete = complete
    return model


async def test_a_member_failing_in_a_simultaneous_slot_cancels_its_peers_turn_at_once():
    taskset = _taskset(Chat)
    task = taskset.task(taskset[0])
    b = Held()
    clients = {"a": ScriptedModel(rule=said), "b": b, "c": failing_after(b.started)}
    episode = await asyncio.wait_for(play(task, clients), 10)  # a guard only: without the cancel, b waits forever
    assert b.cancelled.is_set()  # b's model call was cancelled, not waited for
    assert episode.error.stage == "c:model" and episode.error.kind == tg.ErrorKind.INFRASTRUCTURE
    assert episode.stop_reason == tg.StopReason.ERROR and task.applied == [("a", "a says 0")]  # slot 2 applied nothing
    traces = episode.traces
    assert [e.stage for e in traces["c"].errors] == ["model"] and traces["c"].stop_reason == tg.StopReason.ERROR
    peer = traces["b"]  # cancelled by c's failure: no error of its own, only the episode's, marked as such
    assert (peer.stop_reason, peer.stopped_by, peer.failure) == (tg.StopReason.CANCELLED, "c", FailureKind.CANCELLED)
    assert [e.stage for e in peer.errors] == ["episode:c:model"]
    assert [(s.name, s.turn) for s in peer.spans if s.turn is not None] == [("model", 1)]  # the cancelled call
    assert peer.messages[-1].role == "user"  # b's view up to its turn; no reply
    assert traces["a"].stop_reason == tg.StopReason.ERROR and episode.rewards == {"a": None, "b": None, "c": None}


async def test_the_cancel_reaches_no_sibling_episode():
    taskset = _taskset(Chat)
    failing, healthy = taskset.task(taskset[0]), taskset.task(taskset[0])
    doomed_b, go = Held(), asyncio.Event()
    sibling_b = ScriptedModel(rule=said)
    started = asyncio.Event()

    async def complete(request, inner=sibling_b.complete):  # in flight in the sibling while the other fails
        started.set()
        await go.wait()
        return await inner(request)

    sibling_b.complete = complete
    sibling = asyncio.ensure_future(play(healthy, {"a": ScriptedModel(rule=said), "b": sibling_b,
                                                   "c": ScriptedModel(rule=said)}))
    failed = await asyncio.wait_for(play(failing, {"a": ScriptedModel(rule=said), "b": doomed_b,
                                                   "c": failing_after(doomed_b.started, started)}), 10)
    assert failed.error.stage == "c:model" and doomed_b.cancelled.is_set()
    assert not sibling.done()
    go.set()
    fine = await asyncio.wait_for(sibling, 10)
    assert fine.ok and [m for m, _ in healthy.applied] == ["a", "b", "c", "a", "b", "c"]
    assert all(t.stop_reason == tg.StopReason.COMPLETED for t in fine.traces.values())


class Ledger(MultiAgentTask):
    """a alone, then a, b and c at once; b always forfeits (no retries), and c's act raises once the board holds
    a move: the second slot's third move fails after two were applied (one of them a forfeit)."""

    seats = Chat.seats
    move_retries = 0
    shared_state = ("referee",)

    def __init__(self, data, **options):
        super().__init__(data, **options)
        self.board: dict[str, str] = {}
        self.log = [self.board]  # aliases the board: a snapshot keeps them one object
        self.referee = object()  # not game state: shared, never copied

    def schedule(self):
        yield Slot("a")
        yield Slot("a", "b", "c")

    def move(self, member, text):
        if member == "b":
            raise InvalidMove("b may not move.")
        return text

    def act(self, member, move):
        if member == "c" and self.board:
            raise ValueError("c's move breaks the board")
        if self.board:
            self.late = member  # an attribute first set in the second slot
        self.board[member] = move


async def test_a_move_that_fails_mid_slot_undoes_the_moves_of_that_slot_applied_before_it():
    taskset = _taskset(Ledger)
    task = taskset.task(taskset[0])
    referee = task.referee
    episode = await play(task, {m: ScriptedModel(rule=said) for m in task.members})
    assert episode.error.stage == "act:c" and "c's move breaks the board" in episode.error.message
    assert episode.stop_reason == tg.StopReason.ERROR and episode.outcomes == {}
    # as after slot 1: a's second move and b's forfeit are undone
    assert task.board == {"a": "a says 0"} and task.log == [task.board] and task.log[0] is task.board
    assert not hasattr(task, "late") and not task.over and task.outcomes == {}
    assert task.referee is referee  # shared state: the same object
    assert episode.metrics["forfeits"] == 0  # the undone forfeit is not counted


async def test_state_that_cannot_be_copied_is_named_and_shared_state_is_never_copied():
    import threading

    class Locked(Ledger):
        def __init__(self, data, **options):
            super().__init__(data, **options)
            self.lock = threading.Lock()

    taskset = _taskset(Locked)
    task = taskset.task(taskset[0])
    episode = await play(task, {m: ScriptedModel(rule=said) for m in task.members})
    assert episode.error.stage == "snapshot" and "Locked.lock cannot be copied" in episode.error.message
    assert "shared_state" in episode.error.message

    class Shared(Locked):
        shared_state = ("referee", "lock")

    task = _taskset(Shared).task(taskset[0])
    lock = task.lock
    episode = await play(task, {m: ScriptedModel(rule=said) for m in task.members})
    assert episode.error.stage == "act:c" and task.lock is lock and task.board == {"a": "a says 0"}

class Random(MultiAgentTask):
    """A random cast and schedule, drawn from the row's seed."""

    def __init__(self, data, **options):
        super().__init__(data, **options)
        self.rng = random.Random(data.seed)

    def schedule(self):
        ids = self.members
        for _ in range(self.rng.randint(1, 8)):
            yield Slot(*self.rng.sample(ids, self.rng.randint(1, len(ids))))


def random_reply(rng: random.Random):
    """Replies whose secret (named after the speaker) is always in a private place, well-formed or not, and whose
    well-formed ones end with public text that must reach the others."""
    def rule(request):
        who, n = speaker(request), rng.randrange(10**9)
        secret, public = f"SECRET-{who}-{n}", f"PUBLIC-{who}-{n}"
        shapes = [f"<think>{secret}</think>{public}", f"pub <think>{secret}", f"{secret}</think> pub",
                  f"<think>x<think>{secret}</think>y</think>z", f"a<think>{secret}</think>b<think>{secret}</think>c",
                  f"</think>pub<think>{secret}", f"<think></think>{secret}</think>",
                  f"{public} <think>{secret}</think>"]
        return rng.choice(shapes)
    return rule


async def test_private_reasoning_never_reaches_another_member_over_many_random_schedules():
    public_seen = 0
    for seed in range(200):
        rng = random.Random(seed)
        count = rng.randint(2, 4)

        class Cast(Random):
            seats = tuple(Member(id=f"m{i}", system_prompt=f"You are m{i}.") for i in range(count))

        taskset = _taskset(Cast)
        task = taskset.task({"prompt": "Go.", "seed": seed})
        episode = await play(task, {m: ScriptedModel(rule=random_reply(rng)) for m in task.members})
        assert episode.error is None, episode.error
        for member, trace in episode.traces.items():
            shown = " ".join(m.text for m in trace.messages if m.role != "assistant")
            others = [m for m in episode.members if m != member]
            assert not any(f"SECRET-{o}-" in shown for o in others), (seed, member, shown)
            public_seen += sum(shown.count(f"PUBLIC-{o}-") for o in others)
    assert public_seen > 100  # the others' public output does reach each view


async def test_malformed_markup_is_committed_flagged_counted_and_masked_from_training():
    replies = iter(["<think>plan", "fine</think> move", "<think>ok</think> clean"])

    class Two(MultiAgentTask):
        seats = (Member(id="a", system_prompt="You are a."),)
        rounds = 3

    episode = await run_episode(_taskset(Two), _taskset(Two)[0],
                                ScriptedModel(rule=lambda r: next(replies), tokens=True))
    trace = episode.traces["a"]
    flags = [n.parse_error for n in trace.graph.nodes if n.sampled]
    assert flags == [True, True, False]
    assert episode.metrics["parse_errors"] == 2 and episode.member_metrics["a"]["parse_errors"] == 2
    assert episode.ended_normally  # the episode went on
    [sample] = trace_samples(trace)
    nodes = [n for n in trace.graph.nodes if n.token_ids]
    position = 0
    for node in nodes:
        span = sample.loss_mask[position: position + len(node.token_ids)]
        assert sample.token_ids[position: position + len(node.token_ids)] == node.token_ids  # tokens kept
        assert any(span) == (not node.parse_error)
        position += len(node.token_ids)


async def test_invalid_moves_are_retried_then_forfeit():
    class Strict(MultiAgentTask):
        seats = (Member(id="a", system_prompt="You are a."), Member(id="b", system_prompt="You are b."))
        move_retries = 1

        def move(self, member, text):
            if text != "ok":
                raise InvalidMove("say ok.")
            return text

    model = ScriptedModel(rule=lambda r: "ok" if speaker(r) == "a" else "nope")
    episode = await run_episode(_taskset(Strict), _taskset(Strict)[0], model)
    assert episode.outcomes == {"a": Outcome.WIN, "b": Outcome.FORFEIT}
    assert episode.member_metrics["b"]["invalid_moves"] == 2 and episode.metrics["forfeits"] == 1
    assert "Invalid move: say ok. Try again." in [m.text for m in episode.traces["b"].messages]


async def test_a_forfeit_decides_the_game_and_settle_does_not_overwrite_its_outcomes():
    class Judged(MultiAgentTask):
        """Settles by a verdict that would make b win; a's forfeit must stand."""

        seats = (Member(id="a", system_prompt="You are a."), Member(id="b", system_prompt="You are b."))
        move_retries = 0
        settled = 0

        def move(self, member, text):
            if text != "ok":
                raise InvalidMove("say ok.")
            return text

        def settle(self):
            type(self).settled += 1
            self.outcomes = {"a": Outcome.WIN, "b": Outcome.LOSS}

        @tg.reward
        def payoff_reward(self, trace):
            return self.payoff(trace.member)

    model = ScriptedModel(rule=lambda r: "nope" if speaker(r) == "a" else "ok")
    episode = await run_episode(_taskset(Judged), _taskset(Judged)[0], model)
    assert episode.outcomes == {"a": Outcome.FORFEIT, "b": Outcome.WIN} and Judged.settled == 0
    assert episode.rewards == {"a": -1.0, "b": 1.0} and episode.metrics["slots"] == 1


async def test_a_members_prompt_too_long_ends_the_episode_truncated_and_scored():
    class Long(MultiAgentTask):
        seats = (Member(id="a", system_prompt="You are a."), Member(id="b", system_prompt="You are b."))

    model = ScriptedModel(rule=lambda r: "fine")

    async def complete(request, inner=model.complete):
        if speaker(request) == "b":
            raise ContextLengthError("prompt is too long for the context window")
        return await inner(request)

    model.complete = complete
    episode = await run_episode(_taskset(Long), _taskset(Long)[0], model)
    assert episode.stop_reason == tg.StopReason.TRUNCATED and episode.error is None


async def test_an_endpoint_that_is_down_fails_that_episode_only():
    down = Endpoint(base_url="http://127.0.0.1:9/v1", model="gone", max_retries=0)
    taskset = _taskset(Chat)
    episode = await run_episode(taskset, taskset[0], ScriptedModel(rule=said), seats={"c": Seat(model=down)},
                                infra_retries=0)
    assert episode.error is not None and episode.error.kind == tg.ErrorKind.INFRASTRUCTURE
    assert episode.error.stage.startswith("c:")
    assert episode.trainable == {"a": True, "b": True, "c": False} and episode.models["c"] == "gone"
    fine = await run_episode(taskset, taskset[0], ScriptedModel(rule=said))
    assert fine.ok


async def test_bad_input_is_named():
    with pytest.raises(UsageError, match="member id 'a' is given twice"):
        class Twice(MultiAgentTask):
            seats = (Member(id="a"), Member(id="a"))
    with pytest.raises(UsageError, match=r"seat override for 'zed'.*seats: a, b, c"):
        await run_episode(_taskset(Chat), _taskset(Chat)[0], ScriptedModel(rule=said), seats={"zed": Seat()})

    class Stranger(MultiAgentTask):
        seats = (Member(id="a"),)

        def schedule(self):
            yield Slot("a")
            yield Slot("ghost")

    episode = await run_episode(_taskset(Stranger), _taskset(Stranger)[0], ScriptedModel(rule=lambda r: "hi"))
    assert episode.error is not None and "unknown member 'ghost'" in episode.error.message
    assert episode.error.stage == "schedule" and episode.rewards == {"a": None}
    with pytest.raises(VerdictError, match="member 'judge' gave 'C'; a verdict must be one of A, B"):
        verdict("I pick VERDICT: C", ["A", "B"])
    assert verdict("hmm verdict: b", ["A", "B"]) == "B"


async def test_episodes_round_trip_json_and_msgpack_and_run_many_at_once():
    from tracegym.serve.wire import pack, unpack

    episodes = await evaluate_episodes(_taskset(Chat), ScriptedModel(rule=said, tokens=True), rollouts=3,
                                       sampling=tg.Sampling(seed=5))
    assert [e.episode_index for e in episodes] == [0, 1, 2]
    assert {e.traces["a"].sampling["seed"] for e in episodes} == {5, 8, 11}
    for episode in episodes:
        assert Episode.model_validate_json(episode.model_dump_json()) == episode
        assert Episode.model_validate(unpack(pack(episode.model_dump(mode="json")))) == episode


async def test_rollouts_refuse_a_multi_agent_taskset():
    with pytest.raises(UsageError, match="multi-agent: run episodes"):
        await tg.run_rollout(_taskset(Chat), _taskset(Chat)[0], ScriptedModel(rule=said))


async def test_an_episode_of_a_single_agent_taskset_is_its_rollout_as_the_one_member_solo():
    episode = await run_episode(tg.Taskset(id="one", data=[ROW]), tg.TaskData(prompt="x"), ScriptedModel(),
                                episode_index=2)
    [trace] = episode.traces.values()
    assert episode.is_solo and episode.members == [SOLO] and episode.trainable_members == [SOLO]
    assert episode.id == trace.id and trace.episode_id is None and trace.member is None
    assert trace.rollout_index == 2
    assert episode.episode_index == 2 and episode.rewards == {SOLO: trace.reward}
    assert episode.stop_reason == trace.stop_reason and episode.ended_normally


async def test_a_seat_binding_for_a_single_agent_taskset_is_refused_naming_the_seat():
    with pytest.raises(UsageError, match="'judge'"):
        await run_episode(tg.Taskset(id="one", data=[ROW]), tg.TaskData(prompt="x"), ScriptedModel(),
                          seats={"judge": Seat()})


async def test_the_episode_timeout_ends_it_as_a_timeout_with_every_member_unscored():
    from tracegym.testing import Stall
    taskset = _taskset(Chat)
    episode = await run_episode(taskset, taskset[0], ScriptedModel(rule=lambda r: Stall(5)),
                                timeouts=tg.Timeouts(rollout=0.2))
    assert episode.stop_reason == tg.StopReason.TIMEOUT and episode.error.kind == tg.ErrorKind.TIMEOUT
    assert all(t.stop_reason == tg.StopReason.TIMEOUT for t in episode.traces.values())
