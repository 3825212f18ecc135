"""Class-based environments: which methods become tools, and a bad tool method fails when the taskset is built."""

import pytest

import tracegym as tg
from tracegym.envs.environment import environment_tools

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


def test_class_and_static_methods_properties_and_private_methods_are_not_tools():
    assert [t.name for t in environment_tools(Walker)] == ["step"]


def test_a_tool_spec_leaves_out_self():
    [tool] = environment_tools(Walker)
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
