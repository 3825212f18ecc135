"""Testing: fakes shipped as public API (a scripted model, a fake OpenAI-compatible server, trace and episode
builders)."""

from tracegym.testing.episodes import make_episode
from tracegym.testing.fake_server import FakeOpenAIServer
from tracegym.testing.script import Fail, Script, Stall, reply, tool_call
from tracegym.testing.scripted_model import ScriptedModel
from tracegym.testing.traces import make_trace

__all__ = ["Fail", "FakeOpenAIServer", "Script", "ScriptedModel", "Stall", "make_episode", "make_trace", "reply",
           "tool_call"]
