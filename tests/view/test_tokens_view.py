"""Tokens view: a branch's exact tokens coloured by mask and logprob, with their details; the tokenizer loader."""

import json
import subprocess
import sys
from importlib.resources import files

import pytest
from detail_traces import BYTES, SCRIPT, retokenized_trace, text_of, tool_trace, tree
from tokenizers import Tokenizer, models, pre_tokenizers

from tracegym.models.embedded import SERVED_MODEL_NAME, default_cache_dir, is_complete
from tracegym.testing import make_trace
from tracegym.testing.scripted_model import encode, render_body
from tracegym.view.tokens_view import TOKENS_PER_NODE, TokenText, token_text_for, tokens_html


def tokens(fragment: str, css: str) -> list:
    """The token spans (class `css`) inside the tokens box (the legend has token-like spans too)."""
    box = next(d for d in tree(fragment).iter("div") if d.get("class") == "tokens")
    return [t for t in box.iter("span") if css in t.get("class", "").split()]


async def test_sampled_tokens_are_coloured_by_logprob_and_prompt_tokens_are_not():
    trace = await tool_trace()
    html = tokens_html(trace, 0, BYTES)
    sampled, every = tokens(html, "s"), tokens(html, "t")
    last = trace.graph.nodes[-1]
    assert [int(t.get("data-id")) for t in every] == trace.graph.tokens()  # the branch's exact ids, in order
    assert len(sampled) == sum(sum(n.mask or []) for n in trace.graph.nodes)
    assert all("l1" in t.get("class") and t.get("data-lp") == "-0.5000" for t in sampled)  # p = 0.61
    assert "logprob -0.5000 · p 0.607" in sampled[0].get("title")
    assert "".join(t.text or "" for t in sampled[-len(last.token_ids or []) + last.mask.count(0):]) == \
        render_body(last.message)
    prompt = [t for t in every if "s" not in t.get("class").split()]
    assert prompt and not any(t.get("data-lp") for t in prompt)


async def test_message_text_with_a_script_tag_is_inert():
    html = tokens_html(await tool_trace(), 0, BYTES)
    assert "<script" not in html and "&lt;" in html
    assert SCRIPT in text_of(tree(html))  # shown as text


async def test_trained_tokens_policy_version_and_advantage_are_shown():
    trace = await tool_trace(version=4)
    root = tree(tokens_html(trace, 0, BYTES, advantage=-0.25))
    summary = {d.get("data-key"): d.text for d in root.iter("dd")}
    assert summary["advantage"] == "-0.250" and summary["policy version"] == "4"
    assert int(summary["trained"]) == int(summary["sampled"]) > 0
    assert {s.get("data-version") for s in root.iter("span") if "seg" in s.get("class", "").split()} == {"4"}
    assert all("loss" in t.get("class") for t in root.iter("span") if t.get("data-lp"))


def test_a_forked_trace_trains_the_shared_copy_once_and_each_branch_has_its_own_tokens():
    trace = retokenized_trace()
    first, second = (tree(tokens_html(trace, b, BYTES)) for b in (0, 1))
    ids = [[int(t.get("data-id")) for t in r.iter("span") if t.get("data-id")] for r in (first, second)]
    assert ids == [trace.graph.tokens(leaf) for leaf in trace.graph.leaves()]
    assert "First" in text_of(second) and "first" in text_of(first)


async def test_without_a_tokenizer_ids_are_shown_and_the_summary_says_why():
    root = tree(tokens_html(await tool_trace(), 0, None))
    first = next(t for t in root.iter("span") if t.get("data-id"))
    assert first.text == f"[{first.get('data-id')}]" and "raw" in first.get("class")
    assert "no tokenizer found for model scripted" in text_of(root)


def test_a_branch_without_tokens_says_so_and_a_missing_branch_is_an_index_error():
    trace = make_trace()
    assert "No token ids on this branch" in tokens_html(trace, 0, BYTES)
    with pytest.raises(IndexError, match="has 1 branches; there is no branch 3"):
        tokens_html(trace, 3, BYTES)


def test_an_untrainable_trace_shows_its_tokens_and_why_nothing_is_trained():
    trace = retokenized_trace()
    trace.graph.nodes[1] = trace.graph.nodes[1].model_copy(update={"temperature": 0.0})  # greedy
    root = tree(tokens_html(trace, 0, BYTES))
    trained = next(d.text for d in root.iter("dd") if d.get("data-key") == "trained")
    assert trained.startswith("none (") and "greedy" in trained
    assert not any("loss" in (t.get("class") or "") for t in root.iter("span") if t.get("data-id"))


def test_token_text_decodes_characters_split_across_tokens():
    text = "héllo 日本 🙂"
    assert BYTES.pieces(encode(text)) == ["h", "", "é", "l", "l", "o", " ", "", "", "日", "", "", "本", " ", "", "",
                                          "", "🙂"]
    assert "".join(p or "" for p in BYTES.pieces(encode(text))) == text
    assert TokenText({1: b"a"}).pieces([1, 99, 1]) == ["a", None, "a"]


@pytest.mark.skipif(not is_complete(default_cache_dir()), reason="the embedded model has not been converted")
def test_the_embedded_models_tokenizer_json_gives_its_exact_text():
    text_for = token_text_for(SERVED_MODEL_NAME)
    assert text_for is not None
    tokenizer = Tokenizer.from_file(str(default_cache_dir() / "tokenizer.json"))
    text = "<|im_start|>user\nHéllo 日本 world 🙂\n\n  x<|im_end|>"
    ids = tokenizer.encode(text).ids
    assert "".join(p or "" for p in text_for.pieces(ids)) == text
    assert ids[0] in text_for.special and text_for.pieces(ids)[:3] == ["<|im_start|>", "user", "\n"]


def test_a_sentencepiece_style_directory_loads_and_bad_or_missing_ones_give_none(tmp_path):
    vocab = {"[UNK]": 0, "▁hi": 1, "<0xC3>": 2, "<0xA9>": 3, "##s": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "sp").mkdir()
    tokenizer.save(str(tmp_path / "sp" / "tokenizer.json"))
    assert token_text_for(str(tmp_path / "sp")).pieces([1, 2, 3, 4]) == [" hi", "", "é", "s"]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text(json.dumps({"model": "nonsense"}))
    assert token_text_for(str(tmp_path / "bad")) is None
    assert token_text_for(str(tmp_path / "nowhere")) is None and token_text_for("no-org/no-model") is None


def test_the_renderers_import_neither_torch_nor_transformers():
    code = ("import sys; import tracegym.view.tokens_view, tracegym.view.graph_view, tracegym.view.episode_view, "
            "tracegym.view.timeline, tracegym.view.curves; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_static_files_ship_and_fetch_nothing_from_the_network():
    static = files("tracegym.view") / "static"
    script, style = (static / "viewer.js").read_text(), (static / "viewer.css").read_text()
    assert ".t.s.l0" in style and "token-detail" in script
    assert not any(word in script + style for word in ("http://", "https://", "//cdn", "@import"))


async def test_the_tokens_of_private_reasoning_are_marked_private():
    html = tokens_html(await tool_trace(last="<think>secret plan</think>3"), 0, BYTES)
    private = tokens(html, "private")
    assert "".join(t.text or "" for t in private) == "<think>secret plan</think>"
    assert all("s" in t.get("class").split() and "private reasoning" in t.get("title") for t in private)
    assert not tokens(tokens_html(await tool_trace(), 0, BYTES), "private")


async def test_a_node_of_more_tokens_than_the_cap_shows_its_first_and_last_half_and_counts_the_rest():
    trace = await tool_trace(last="y" * 3 * TOKENS_PER_NODE)
    last = trace.graph.nodes[-1]
    count, half = len(last.token_ids or []), TOKENS_PER_NODE // 2
    html = tokens_html(trace, 0, BYTES, reader="/trace/5")
    seg = next(s for s in tree(html).iter("span") if s.get("class") == "seg" and s.get("data-node") == str(last.id))
    shown = [int(t.get("data-id")) for t in seg.iter("span") if "t" in t.get("class", "").split()]
    assert shown == (last.token_ids or [])[:half] + (last.token_ids or [])[-half:]
    [left_out] = [s for s in seg.iter("span") if s.get("class") == "left-out"]
    assert left_out.get("data-left-out") == str(count - TOKENS_PER_NODE)
    assert f"{count - TOKENS_PER_NODE:,} tokens of node {last.id} left out" in text_of(left_out)
    carried = trace.graph.path()[-2:]  # the tool result (in this turn's prompt) and the reply
    assert [a.get("href") for a in left_out.iter("a")] == [f"/trace/5/node/{n.id}/text?page=1" for n in carried]
    assert len(tokens(tokens_html(trace, 0, BYTES), "t")) == len(trace.graph.tokens()) - count + TOKENS_PER_NODE
