"""Class-based environments: which methods become tools, a bad tool method fails when the taskset is built, and
tool methods get arguments converted by their hints and send data results as JSON."""


import pydantic
import pytest

import tracegym as tg
from tracegym.envs.environment import EnvironmentTaskset, environment_tools
from tracegym.testing import ScriptedModel, reply, tool_call

ROW = {"prompt": "walk"}


class Walker:
    """A TRL-shaped environment with one real tool and every kind of method that must not be one."""

    def __init__(self) -> None:
        self.position = 0

    def reset(self, **fields) -> None:
        self.position = 0

    def step(self, steps: int) -> int:
        """Walk forward.

        Args:
            steps: How far to walk.
        """
        self.position += steps
        return self.position

    @classmethod
    def build(cls, size: int) -> "Walker":
        """A class method.

        Args:
            size: Ignored.
        """
        return cls()

    @staticmethod
    def distance(a: int, b: int) -> int:
        """A static method.

        Args:
            a: One end.
            b: The other end.
        """
        return abs(a - b)

    @property
    def where(self) -> int:
        """A property."""
        return self.position

    def _private(self, x: int) -> int:
        """A private method.

        Args:
            x: Ignored.
        """
        return x


def test_class_methods_properties_and_private_methods_are_not_tools_but_static_methods_are():
    """TRL lists tools with `inspect.getmembers(cls, inspect.isfunction)`, which a static method passes."""
    assert [t.name for t in environment_tools(Walker)] == ["distance", "step"]


def test_a_tool_spec_leaves_out_self():
    [_, tool] = environment_tools(Walker)
    assert tool.spec.parameters["properties"].keys() == {"steps"} and tool.spec.parameters["required"] == ["steps"]


def with_method(method):
    """A Walker subclass that also offers `method` as a public method named `jump`."""
    return type("Jumper", (Walker,), {"jump": method})


def test_a_tool_method_without_a_type_hint_fails_when_the_taskset_is_built():
    def jump(self, height):
        """Jump.

        Args:
            height: How high.
        """

    with pytest.raises(tg.UsageError, match=r"tool 'jump': argument 'height' has no type hint"):
        tg.EnvironmentTaskset(with_method(jump), id="walker", data=[ROW])


def test_a_tool_method_missing_from_its_args_section_fails_when_the_taskset_is_built():
    def jump(self, height: int, spin: bool = False):
        """Jump.

        Args:
            height: How high.
        """

    with pytest.raises(tg.UsageError, match=r"tool 'jump': argument 'spin' is not described under 'Args:'"):
        tg.EnvironmentTaskset(with_method(jump), id="walker", data=[ROW])


def test_a_tool_method_without_a_docstring_fails_when_the_taskset_is_built():
    def jump(self, height: int):
        pass

    with pytest.raises(tg.UsageError, match=r"tool 'jump' has no docstring"):
        tg.EnvironmentTaskset(with_method(jump), id="walker", data=[ROW])


class Point(pydantic.BaseModel):
    x: int
    y: int


class Plane:
    """A TRL-shaped environment whose tool takes and returns a pydantic model."""

    def reset(self, **fields) -> None:
        self.at = Point(x=0, y=0)

    def move(self, by: Point, times: int) -> Point:
        """Move the marker.

        Args:
            by: The step.
            times: How many steps.
        """
        self.at = Point(x=self.at.x + by.x * times, y=self.at.y + by.y * times)
        return self.at


async def plane_tool_texts(*calls):
    taskset = tg.EnvironmentTaskset(Plane, id="plane", data=[ROW])
    [trace] = await tg.evaluate(taskset, ScriptedModel([reply(None, *calls), "done"]))
    return [m.text for m in trace.messages if m.role == "tool"], trace


async def test_a_tool_method_gets_a_model_argument_and_its_model_result_is_sent_as_trl_sends_it_by_str():
    [text], trace = await plane_tool_texts(tool_call("move", {"by": {"x": 1, "y": 2}, "times": "3"}))
    assert text == "x=3 y=6" and trace.errors == []  # str() of the returned model, as TRL's GRPOTrainer does


async def test_a_tool_method_argument_that_does_not_fit_its_hint_is_a_tool_error_naming_it():
    [text], trace = await plane_tool_texts(tool_call("move", {"by": {"x": 1, "y": 2}, "times": "notanint"}))
    assert text.startswith("{'error': \"invalid arguments for tool 'move'") and "times" in text  # TRL's shape
    assert trace.metrics["tool_errors"] == 1


class TypedInDocstring:
    """A class TRL refuses: its tool's argument is described Google-style with its type, `x (int): ...`."""

    def reset(self, **kwargs):
        return "Go."

    def step(self, x: int) -> str:
        """Take a step.

        Args:
            x (int): how far
        """
        return str(x)


def test_a_tool_docstring_trl_cannot_read_is_refused_with_trls_reason():
    with pytest.raises(tg.UsageError, match=r"tool TypedInDocstring.step: TRL refuses it: .*no description for the "
                                             r"argument 'x'"):
        EnvironmentTaskset(TypedInDocstring, id="typed", data=[{"prompt": "go"}])
