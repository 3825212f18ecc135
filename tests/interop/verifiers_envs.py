"""verifiers environment modules in the shapes verifiers documents (`load_environment()` returning a
SingleTurnEnv, a MultiTurnEnv subclass, a ToolEnv), written to files by the tests that run them."""

SINGLE_TURN = '''
import verifiers as vf
from datasets import Dataset


def load_environment(words=("apple", "pear", "plum"), **kwargs) -> vf.Environment:
    dataset = Dataset.from_list([{"question": f"Say {w}", "answer": w} for w in words])

    def exact(completion, answer, **kwargs) -> float:
        return float(completion[-1]["content"].strip() == answer)

    async def length(completion) -> float:
        return float(len(completion[-1]["content"]))

    rubric = vf.Rubric(funcs=[exact, length], weights=[1.0, 0.0])
    return vf.SingleTurnEnv(dataset=dataset, system_prompt="Answer in one word.", rubric=rubric)
'''

MULTI_TURN = '''
import verifiers as vf
from datasets import Dataset


class GuessEnv(vf.MultiTurnEnv):
    """The model guesses a number; the environment says higher or lower until it is found."""

    async def setup_state(self, state):
        state["guesses"] = 0
        return state

    async def env_response(self, messages, state, **kwargs):
        state["guesses"] += 1
        guess = int(messages[-1]["content"].strip())
        target = int(state["answer"])
        return [{"role": "user", "content": "higher" if guess < target else "lower"}]

    @vf.stop
    async def found(self, state) -> bool:
        trajectory = state["trajectory"]
        return bool(trajectory) and trajectory[-1]["completion"][-1]["content"].strip() == state["answer"]


def load_environment(max_turns: int = 5) -> vf.Environment:
    dataset = Dataset.from_list([{"question": "Guess my number (1-9).", "answer": "7"}])

    def solved(state) -> float:
        return float(state["trajectory"][-1]["completion"][-1]["content"].strip() == state["answer"])

    def guesses(state) -> float:
        return float(state["guesses"])

    return GuessEnv(dataset=dataset, rubric=vf.Rubric(funcs=[solved, guesses], weights=[1.0, 0.0]),
                    max_turns=max_turns)
'''

TOOLS = '''
import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def load_environment() -> vf.Environment:
    dataset = Dataset.from_list([{"question": "What is 2 + 3? Use the tool.", "answer": "5"}])

    def correct(completion, answer) -> float:
        return float(answer in (completion[-1]["content"] or ""))

    return vf.ToolEnv(dataset=dataset, tools=[add], rubric=vf.Rubric(funcs=[correct]), max_turns=4)
'''

FAILING_REWARD = '''
import verifiers as vf
from datasets import Dataset


def load_environment() -> vf.Environment:
    dataset = Dataset.from_list([{"question": "Say hi", "answer": "hi"}])

    def broken(completion) -> float:
        raise ValueError("no verdict")

    def fine(completion) -> float:
        return 1.0

    return vf.SingleTurnEnv(dataset=dataset, rubric=vf.Rubric(funcs=[broken, fine]))
'''

GROUP_REWARD = '''
import verifiers as vf
from datasets import Dataset


def load_environment() -> vf.Environment:
    dataset = Dataset.from_list([{"question": "Say hi", "answer": "hi"}])

    def best_of_group(completions) -> list[float]:
        return [1.0 for _ in completions]

    return vf.SingleTurnEnv(dataset=dataset, rubric=vf.Rubric(funcs=[best_of_group]))
'''

RAISING_ENV_RESPONSE = '''
import verifiers as vf
from datasets import Dataset


class Broken(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        raise ValueError("the board is gone")


def load_environment(timeout_seconds=None) -> vf.Environment:
    dataset = Dataset.from_list([{"question": "Move.", "answer": "x"}])
    return Broken(dataset=dataset, rubric=vf.Rubric(funcs=[lambda completion: 1.0]), max_turns=3,
                  timeout_seconds=timeout_seconds)
'''

FINAL_WORD = '''
import verifiers as vf
from datasets import Dataset


class OneShot(vf.MultiTurnEnv):
    """Grades the first reply and ends with a final word the model never reads."""

    async def env_response(self, messages, state, **kwargs):
        verdict = [{"role": "user", "content": "right" if messages[-1]["content"] == "4" else "wrong"}]
        state["final_env_response"] = verdict
        return verdict


def load_environment() -> vf.Environment:
    dataset = Dataset.from_list([{"question": "2 + 2?", "answer": "4"}])

    def graded(completion) -> float:
        return float(completion[-1]["content"] == "right")

    return OneShot(dataset=dataset, rubric=vf.Rubric(funcs=[graded]), max_turns=5)
'''
