"""Token client: the model client that renders prompts locally and sends token ids to vLLM's completions endpoint.

Each turn's prompt extends the branch's exact tokens through the renderer's bridge (previous prompt ids +
sampled completion ids + the new messages); when the bridge cannot prove that safe, the whole conversation is
rendered and the message graph forks if the render does not extend the branch. vLLM answers `/v1/completions`
with a token-id prompt, returning the sampled ids (`return_token_ids`) and their logprobs; the assistant
message (content, tool calls) is parsed from those ids, never from re-tokenized text. A matched stop string
stays in the ids (they are what was sampled) but not in the message, as with vLLM's chat endpoint. HTTP,
retries and error mapping are the transport's (`models.transport`), as for the chat client. A request with a
`stream` is streamed (`models.streaming`): each chunk's `token_ids` and `logprobs.token_logprobs` are folded into
the body the unstreamed call returns, parsed by the same `parse_completion`; the message shown as it grows is the
renderer's parse of the ids so far.

A prompt with images (on a VLM, whose renderer expands each image into the placeholder run its processor makes:
`models.image_prompt`) goes to vLLM's token-in/token-out endpoint instead (`/inference/v1/generate`, served with
`--enable-scale-out`): the prompt ids with each image's run collapsed to one image token, plus the images as
`content_parts`; vLLM expands each with its own processor and answers with the prompt ids it made, which must equal
ours (else a ModelError: the tokens would not be exact). The response records each image's run and hash
(`ModelResponse.prompt_images`). That call is not streamed: its reply is shown once it returns, as for a client
that does not stream. A text-only model refuses images.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tracegym.core.errors import ModelError, TracegymError
from tracegym.core.messages import ImagePart, Message
from tracegym.models.client import ModelRequest, ModelResponse
from tracegym.models.endpoint import Endpoint
from tracegym.models.endpoint_client import EndpointClient
from tracegym.models.image_prompt import ImageTokens, message_images
from tracegym.models.renderer import Renderer
from tracegym.models.streaming import StreamedReply
from tracegym.models.transport import Transport, served_models


class TokenClient(EndpointClient):
    """`TokenClient(Endpoint(base_url=..., model=...), load_renderer(model_dir))`; close with `await
    client.aclose()` or `async with`."""

    def __init__(self, endpoint: Endpoint, renderer: Renderer, *,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        """`sleep` waits out each retry's backoff (tests pass one that records the delays)."""
        super().__init__(endpoint)
        self.renderer = renderer
        self.transport = Transport(endpoint, sleep=sleep)
        self.generate_transport = Transport(endpoint.model_copy(update={"base_url": server_root(endpoint.base_url)}),
                                            sleep=sleep)
        self._max_model_len: int | None = None

    async def aclose(self) -> None:
        """Close this event loop's connections."""
        await self.transport.aclose()
        await self.generate_transport.aclose()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One completion on this turn's prompt ids, retried on transient failures; raises tracegym errors."""
        prompt_ids = self.prompt_ids(request)
        images = message_images(request.messages)
        if images:
            return await self._complete_with_images(request, prompt_ids, images)
        body = completion_body(self.endpoint.model, request, prompt_ids, self.renderer.stop_token_ids)
        if body["max_tokens"] is None:  # vLLM's completions would stop at 16; ask for the rest of the context
            body["max_tokens"] = await self._context_length()
        reader = None
        if request.stream is not None:
            body["stream"] = True
            reader = StreamedReply(request.stream, CompletionChunks, lambda b: self.parse_completion(b, prompt_ids))
        reply = await self.transport.post("/completions", body, reader)
        include_stop_str = bool(body.get("include_stop_str_in_output"))
        return self.parse_completion(reply.data, prompt_ids, include_stop_str=include_stop_str,
                                     policy_version=reply.policy_version)

    async def _complete_with_images(self, request: ModelRequest, prompt_ids: list[int],
                                    images: list[ImagePart]) -> ModelResponse:
        """One completion through vLLM's generate endpoint: our prompt ids and the images (see the module)."""
        tokens = image_tokens(self.renderer)
        assert tokens is not None, "next_prompt_ids refuses images without a VLM renderer"
        spans = tokens.spans(prompt_ids, images)
        body = generate_body(self.endpoint.model, request, tokens.collapse(prompt_ids, spans), images,
                             self.renderer.stop_token_ids)
        reply = await self.generate_transport.post(GENERATE_ROUTE, body)
        served = reply.data.get("prompt_token_ids")
        if served is not None and list(served) != prompt_ids:
            raise ModelError(f"vLLM expanded the image prompt into {len(served)} tokens, not our {len(prompt_ids)}: "
                             "its processor and ours disagree, so the tokens would not be exact")
        include_stop_str = bool(body["sampling_params"].get("include_stop_str_in_output"))
        response = self.parse_completion(completion_shape(reply.data), prompt_ids, include_stop_str=include_stop_str,
                                         policy_version=reply.policy_version)
        return dataclasses.replace(response, prompt_images=spans)

    async def _context_length(self) -> int | None:
        """The served model's `max_model_len` from the endpoint's model list (kept once known; None when the
        list does not say or cannot be had: the server's default then applies)."""
        if self._max_model_len is None:
            endpoint = self.endpoint
            try:
                listed = await asyncio.to_thread(served_models, endpoint.base_url, endpoint.api_key(), endpoint.timeout)
            except TracegymError:
                return None
            lengths = [m.get("max_model_len") for m in listed if m.get("id") == endpoint.model]
            self._max_model_len = lengths[0] if lengths and isinstance(lengths[0], int) else None
        return self._max_model_len

    def prompt_ids(self, request: ModelRequest) -> list[int]:
        """This turn's prompt ids (`next_prompt_ids`)."""
        return next_prompt_ids(self.renderer, request)

    def parse_completion(self, data: dict[str, Any], prompt_ids: list[int], *, include_stop_str: bool = False,
                         policy_version: int | None = None) -> ModelResponse:
        """A ModelResponse from vLLM's completions body (sampled ids, their logprobs, the parsed message) and the
        policy version its headers reported.

        vLLM keeps the ids through a matched stop string but cuts it from the text; the message is cut the
        same way (as its chat endpoint would, unless `include_stop_str`), the ids and logprobs never are."""
        choice, completion_ids, logprobs = _sampled(data)
        finish = choice.get("finish_reason")
        stop = choice.get("stop_reason") if finish == "stop" and not include_stop_str else None
        if isinstance(stop, str) and stop:  # a stop string matched (an int is a stop token id)
            message = self.renderer.parse(completion_ids, stop=stop)
        else:
            message = self.renderer.parse(completion_ids)
        if finish == "stop" and message.tool_calls:
            finish = "tool_calls"
        return ModelResponse(
            message=message,
            finish_reason=finish,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(completion_ids),
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids,
            completion_logprobs=logprobs,
            policy_version=policy_version,
        )


def next_prompt_ids(renderer: Renderer, request: ModelRequest) -> list[int]:
    """The bridge onto the branch's tokens when the request says which of them were sampled and the renderer
    proves the extension safe; else the whole conversation rendered. (SFT renders a teacher's conversation for
    the student through this too, so its samples hold the tokens the student sees at inference.) A renderer without
    images (a text-only model's) refuses a message with one."""
    if image_tokens(renderer) is None:
        refuse_images(request.messages)
    prefix = request.prefix
    if prefix is not None:
        new = request.messages[prefix.covered_messages:]
        bridged = renderer.bridge(prefix.prompt_ids, prefix.completion_ids, new, request.tools)
        if bridged is not None:
            return bridged
    return renderer.render(request.messages, request.tools)


def image_tokens(renderer: Renderer) -> ImageTokens | None:
    """The renderer's image placeholders when it renders images (a VLM's `ChatMLRenderer`), else None."""
    found = getattr(renderer, "images", None)
    return found if isinstance(found, ImageTokens) else None


def refuse_images(messages: Sequence[Message]) -> None:
    """A ModelError naming the first message with an image: this model's renderer renders text only, and an image
    left out would train a policy on a prompt it never saw."""
    for i, message in enumerate(messages):
        if isinstance(message.content, list) and any(isinstance(p, ImagePart) for p in message.content):
            raise ModelError(f"message {i} ({message.role}) carries an image, and the token client renders text "
                             "only for this model (it would be dropped): serve a VLM (`tracegym inference --vlm`), "
                             "or use --model.client chat, whose server renders images")


def _sampled(data: dict[str, Any]) -> tuple[dict[str, Any], list[int], list[float]]:
    """The first choice, its sampled ids and their logprobs (one each; a missing one is a ModelError)."""
    try:
        choice = data["choices"][0]
        completion_ids = [int(t) for t in choice["token_ids"]]
        raw = (choice.get("logprobs") or {})["token_logprobs"]
        logprobs = [float(lp) if lp is not None else None for lp in raw]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ModelError(f"malformed completion, no token ids or logprobs ({type(exc).__name__}: {exc}); "
                         f"is the endpoint vLLM? {str(data)[:300]}") from None
    if len(logprobs) != len(completion_ids):
        raise ModelError(f"{len(logprobs)} logprobs for {len(completion_ids)} sampled tokens")
    missing = [i for i, lp in enumerate(logprobs) if lp is None]
    if missing:
        raise ModelError(f"the completion has no logprob for sampled token {missing[0]} "
                         f"({len(missing)} of {len(logprobs)} missing); training needs every one")
    return choice, completion_ids, [lp for lp in logprobs if lp is not None]


class CompletionChunks:
    """`text_completion` stream events folded into the completions body they stream (choice 0)."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.text: list[str] = []
        self.choice: dict[str, Any] = {"index": 0, "token_ids": [], "logprobs": {"token_logprobs": []},
                                       "finish_reason": None, "stop_reason": None}

    def add(self, chunk: dict[str, Any]) -> bool:
        for key in ("id", "created", "model", "usage"):
            if chunk.get(key) is not None:
                self.head[key] = chunk[key]
        grew = False
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            self.text.append(choice.get("text") or "")
            ids = choice.get("token_ids") or []
            self.choice["token_ids"].extend(ids)
            self.choice["logprobs"]["token_logprobs"].extend((choice.get("logprobs") or {}).get("token_logprobs")
                                                             or [])
            for key in ("finish_reason", "stop_reason", "prompt_token_ids"):
                if choice.get(key) is not None:
                    self.choice[key] = choice[key]
            grew = grew or bool(ids)
        return grew

    def body(self) -> dict[str, Any]:
        choice = {**self.choice, "text": "".join(self.text)}
        return {**self.head, "object": "text_completion", "choices": [choice]}


def completion_body(model: str, request: ModelRequest, prompt_ids: list[int], stop_ids: list[int]) -> dict[str, Any]:
    """The JSON body of a token-prompt completions call (vLLM's token fields on)."""
    s = request.sampling
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt_ids,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_tokens": s.max_tokens,
        "logprobs": 1,
        "return_token_ids": True,
        "stop_token_ids": stop_ids,
        "skip_special_tokens": False,
    }
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    body.update(s.extra)
    return body


GENERATE_ROUTE = "/inference/v1/generate"
"""vLLM's token-in/token-out endpoint (at the server's root, not under `/v1`; needs `--enable-scale-out`)."""


def server_root(base_url: str) -> str:
    """The server's root URL: `base_url` without its trailing `/v1`."""
    parts = urlsplit(base_url.rstrip("/"))
    return urlunsplit((parts.scheme, parts.netloc, parts.path.removesuffix("/v1"), "", ""))


def generate_body(model: str, request: ModelRequest, prompt_ids: list[int], images: Sequence[ImagePart],
                  stop_ids: list[int]) -> dict[str, Any]:
    """The JSON body of a generate call: the prompt ids (one image token per image), the images as content parts,
    and the sampling settings of `completion_body` as vLLM's `sampling_params` (an unset `max_tokens` is left to
    the server: the rest of the context)."""
    sampling = completion_body(model, request, prompt_ids, stop_ids)
    for key in ("model", "prompt", "return_token_ids"):
        sampling.pop(key)
    if sampling["max_tokens"] is None:
        del sampling["max_tokens"]
    parts = [{"type": "image_url", "url": part.image_url.get("url", "")} for part in images]
    return {"model": model, "token_ids": prompt_ids, "content_parts": parts, "sampling_params": sampling,
            "return_token_ids": True}


def completion_shape(data: dict[str, Any]) -> dict[str, Any]:
    """A generate reply in the completions shape `parse_completion` reads (choice 0: its ids, each sampled
    token's logprob, why it stopped)."""
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise ModelError(f"malformed generate reply, no choices: {str(data)[:300]}") from None
    content = (choice.get("logprobs") or {}).get("content") or []
    return {"choices": [{**choice, "logprobs": {"token_logprobs": [entry.get("logprob") for entry in content]}}]}
