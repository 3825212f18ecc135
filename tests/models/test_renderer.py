"""Renderer: ChatML parity with the tokenizer's own template, the multi-turn bridge, parsing sampled ids."""

import pytest

from tracegym.core.errors import UsageError
from tracegym.core.messages import Message, assistant, system, tool, user
from tracegym.core.tool_spec import ToolSpec
from tracegym.models.renderer import ChatMLRenderer, LibraryRenderer, load_tokenizer, renderer_for
from tracegym.testing.script import reply, tool_call

ADD = ToolSpec(name="add", description="Add two numbers.",
               parameters={"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}})


def template_ids(tokenizer, messages: list[Message], add_generation_prompt: bool = True) -> list[int]:
    rendered = tokenizer.apply_chat_template([m.to_openai() for m in messages], tokenize=True,
                                             add_generation_prompt=add_generation_prompt)
    return list(rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered)


CONVERSATIONS = {
    "one user turn": [user("Reverse the text: hello world")],
    "with a system prompt": [system("You play wordle."), user("Guess a word.")],
    "multi-turn": [system("Be brief."), user("hi"), assistant("Hello! How can I help?"), user("Count to 3."),
                   assistant("1, 2, 3"), user("Thanks")],
    "unicode and newlines": [user("Résumé:\n\n- ünïcode ✓\n  indented"), assistant("Noted.\n\nDone"), user("ok")],
}


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_plain_conversations_render_like_the_tokenizers_chat_template(smol, smol_tokenizer, name):
    messages = CONVERSATIONS[name]
    assert smol.render(messages) == template_ids(smol_tokenizer, messages)


def test_without_generation_prompt_matches_the_template_too(smol, smol_tokenizer):
    messages = CONVERSATIONS["multi-turn"]
    assert smol.render(messages, add_generation_prompt=False) == template_ids(smol_tokenizer, messages, False)


def test_the_default_system_prompt_is_read_from_the_template(smol):
    assert smol.default_system is not None and "SmolLM" in smol.default_system


def test_tools_go_into_the_system_prompt_after_its_text(smol):
    text = smol.decode(smol.render([system("Use tools."), user("1+2?")], [ADD]))
    assert text.startswith("<|im_start|>system\nUse tools.\n\n# Tools")
    assert '"name": "add"' in text and "<tool_call>" in text
    assert text.count("<|im_start|>system") == 1


def bridged_vs_full(renderer, history: list[Message], sampled: Message, new: list[Message], tools=()):
    """(bridge of the canonical completion, full render of the whole conversation)."""
    prompt = renderer.render(history, tools)
    completion = renderer.completion_ids(sampled)
    bridged = renderer.bridge(prompt, completion, new, tools)
    return bridged, renderer.render([*history, sampled, *new], tools)


def test_bridge_equals_the_full_render_on_a_multi_turn_conversation(smol):
    bridged, full = bridged_vs_full(smol, [system("Be brief."), user("hi")], assistant("Hello there."),
                                    [user("Count to 3.")])
    assert bridged == full


def test_bridge_equals_the_full_render_across_tool_calls_and_results(smol):
    call = tool_call("add", {"a": 1, "b": 2})
    history = [system("Use tools."), user("1+2?")]
    bridged, full = bridged_vs_full(smol, history, reply("Let me add.", call),
                                    [tool("3", tool_call_id=call.id, name="add")], [ADD])
    assert bridged == full


def test_bridge_equals_the_full_render_with_several_new_messages(smol):
    calls = [tool_call("add", {"a": 1, "b": 2}), tool_call("add", {"a": 3, "b": 4})]
    new = [tool("3", calls[0].id), tool("7", calls[1].id), user("And now?")]
    bridged, full = bridged_vs_full(smol, [user("sums")], reply(None, *calls), new, [ADD])
    assert bridged == full


def test_bridge_keeps_sampled_ids_that_a_re_render_would_tokenize_differently(smol):
    prompt = smol.render([user("hi")])
    drifted = [*(t for ch in "Hello" for t in smol.encode(ch)), smol.im_end]  # one token per letter
    bridged = smol.bridge(prompt, drifted, [user("again")])
    assert bridged[: len(prompt) + len(drifted)] == prompt + drifted
    assert bridged != smol.render([user("hi"), assistant("Hello"), user("again")])


def test_bridge_closes_a_truncated_completion_as_unsampled_prompt(smol):
    prompt = smol.render([user("hi")])
    cut = smol.encode("Hello the")
    bridged = smol.bridge(prompt, cut, [user("go on")])
    assert bridged[: len(prompt) + len(cut) + 1] == [*prompt, *cut, smol.im_end]


def test_bridge_refuses_a_new_assistant_message(smol):
    prompt = smol.render([user("hi")])
    assert smol.bridge(prompt, smol.completion_ids(assistant("yo")), [assistant("injected"), user("x")]) is None


def test_bridge_refuses_tokens_after_the_sampled_close(smol):
    prompt = smol.render([user("hi")])
    assert smol.bridge(prompt, [*smol.completion_ids(assistant("yo")), *smol.encode("junk")], [user("x")]) is None


def test_bridge_refuses_without_new_messages(smol):
    prompt = smol.render([user("hi")])
    assert smol.bridge(prompt, smol.completion_ids(assistant("yo")), []) is None


def test_parse_round_trips_content_and_tool_calls(smol):
    sent = reply("Adding.", tool_call("add", {"a": 1, "b": 2}), tool_call("add", {"a": 5, "b": 6}))
    parsed = smol.parse(smol.completion_ids(sent))
    assert parsed.content == "Adding."
    assert [(c.name, c.parsed_arguments()) for c in parsed.tool_calls] == [("add", {"a": 1, "b": 2}),
                                                                            ("add", {"a": 5, "b": 6})]


def test_parse_of_plain_text_has_no_tool_calls(smol):
    parsed = smol.parse(smol.completion_ids(assistant("CRANE")))
    assert parsed.content == "CRANE" and parsed.tool_calls == []


def test_malformed_tool_call_json_keeps_its_raw_text_as_arguments(smol):
    raw = '{"name": "add", "arguments": {"a": 1,, }}'
    parsed = smol.parse([*smol.encode(f"<tool_call>\n{raw}\n</tool_call>"), smol.im_end])
    [call] = parsed.tool_calls
    assert call.name == "add" and call.arguments == raw
    with pytest.raises(ValueError, match="not valid JSON"):
        call.parsed_arguments()


def test_an_unclosed_last_tool_call_still_counts(smol):
    parsed = smol.parse(smol.encode('Sure <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}'))
    assert parsed.content == "Sure" and parsed.tool_calls[0].parsed_arguments() == {"a": 1, "b": 2}


def test_the_renderers_generic_fallback_never_bridges(smol_tokenizer):
    from renderers import create_renderer

    library = LibraryRenderer(create_renderer(smol_tokenizer), smol_tokenizer)
    prompt = library.render([user("hi")])
    assert prompt == template_ids(smol_tokenizer, [user("hi")])
    assert library.bridge(prompt, library.completion_ids(assistant("yo")), [user("x")]) is None


def test_a_chatml_template_gets_our_renderer(smol_tokenizer):
    assert isinstance(renderer_for(smol_tokenizer), ChatMLRenderer)


def test_bridging_turn_after_turn_equals_the_full_render_every_time(smol):
    first, second, third = (tool_call("add", {"a": 1, "b": 2}), tool_call("add", {"a": 3, "b": 4}),
                            tool_call("add", {"a": 5, "b": 6}))
    turns = [  # (what the model sampled, the messages that followed it)
        (reply("Let me add.", first), [tool("3", first.id, name="add")]),
        (assistant("It is 3."), [user("Now 3+4 and 5+6, both.")]),
        (reply(None, second, third), [tool("7", second.id, name="add"), tool("11", third.id, name="add")]),
        (assistant("7 and 11."), [user("Thanks! Résumé?\n\n- ok")]),
        (assistant("Done: 3, 7, 11."), [user("bye")]),
    ]
    conversation = [system("Use tools."), user("1+2?")]
    prompt = smol.render(conversation, [ADD])
    for sampled, new in turns:
        prompt = smol.bridge(prompt, smol.completion_ids(sampled), new, [ADD])
        conversation += [sampled, *new]
        assert prompt == smol.render(conversation, [ADD]), f"after {len(conversation)} messages"


def test_chatml_named_explicitly_gets_our_renderer_with_the_templates_default_system(smol_tokenizer):
    chosen = renderer_for(smol_tokenizer, "chatml")
    assert isinstance(chosen, ChatMLRenderer)
    assert chosen.render([user("hi")]) == template_ids(smol_tokenizer, [user("hi")])


def test_a_tokenizer_that_cannot_be_loaded_is_asked_for_once_and_names_the_flag(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(UsageError, match=r"--model\.tokenizer") as first:
        load_tokenizer(missing)
    with pytest.raises(UsageError) as second:
        load_tokenizer(missing)
    assert second.value is first.value  # the second rollout fails at once, on the first one's answer
