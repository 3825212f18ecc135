"""Teacher: the model an `sft` or `opd` run learns from, reached at its `base_url` or at the vLLM server the run
serves it with (`launch_plan.TeacherPlan`), checked to tokenize as the student does, and asked for its logprob of
each of a sequence's tokens.

Scoring goes through vLLM's completions API with the token ids as the prompt and `prompt_logprobs = 0` (one request
per sequence; each prompt position's entry holds the actual next token's logprob, computed from the raw logits
whatever `--logprobs-mode` says), or through transformers in this process (`TransformersTeacher`) where no teacher
endpoint is wanted. An endpoint that stays down through the teacher's retries stops the run, naming it.

A sample with images (an image taskset's) is scored by `TransformersTeacher` on a VLM folder: each image's features
(`train.image_inputs`; the bytes by hash from the step's traces, `distillation.StepImages`) go into its run of
`<image>` tokens, as the trainer puts them. The completions API takes token ids only, so `VLLMTeacher` refuses
images by name.

>>> teacher = VLLMTeacher(endpoint)  # doctest: +SKIP
>>> await teacher.logprobs([1, 2, 3])  # doctest: +SKIP
[-2.1, -0.4]
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tracegym.core.errors import InfrastructureError, ModelError, TracegymError, UsageError
from tracegym.core.graph import ImageSpan
from tracegym.models import transport
from tracegym.models.endpoint import Endpoint
from tracegym.models.launch import only_served_model
from tracegym.models.transport import PROBE_TIMEOUT_S, Unavailable, backoff_delay, served_models
from tracegym.train.distillation import Teacher
from tracegym.train.image_inputs import ImageInputs, ImageSource, check_trainable, is_vlm
from tracegym.train.rl_config import TeacherModel
from tracegym.train.rl_folder import Endpoints

PROBE = "Reverse 'river mountain' -> 'niatnuom revir'! 123 + 4.5 = ? ¿Qué tal? 你好 <|im_start|>user\n\t ok<|im_end|>"
"""Text whose token ids must be the same under the student's and the teacher's tokenizer (words, digits, accents,
CJK, whitespace, chat-template markers)."""


class VLLMTeacher:
    """The teacher at a vLLM endpoint; the endpoint's `max_retries` and `timeout` bound each request."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.transport = transport.Transport(endpoint)

    async def logprobs(self, token_ids: list[int], images: Sequence[ImageSpan] = ()) -> list[float]:
        if images:
            raise UsageError(f"the [teacher] endpoint {self.endpoint.base_url} cannot score a sample with images: "
                             "vLLM's completions API takes token ids only; set [opd] scorer = 'transformers' with "
                             "[teacher] name a vision-language model's folder")
        body = {"model": self.endpoint.model, "prompt": token_ids, "max_tokens": 1, "prompt_logprobs": 0,
                "temperature": 1.0}
        try:
            reply = await self.transport.post("/completions", body)
        except InfrastructureError as exc:
            raise InfrastructureError(f"the [teacher] endpoint {self.endpoint.base_url} is down: {exc}") from None
        except ModelError as exc:
            raise ModelError(f"the [teacher] endpoint {self.endpoint.base_url} refused to score: {exc}") from None
        return prompt_logprobs(reply.data, token_ids)

    async def aclose(self) -> None:
        await self.transport.aclose()


def prompt_logprobs(data: dict[str, Any], token_ids: list[int]) -> list[float]:
    """The logprob of each of `token_ids[1:]` in a vLLM completions reply with `prompt_logprobs` (a list with one
    entry per prompt token: None for the first, then `{str(token_id): {"logprob": ...}, ...}`)."""
    try:
        entries = data["choices"][0]["prompt_logprobs"]
        if len(entries) != len(token_ids):
            raise ValueError(f"{len(entries)} entries for {len(token_ids)} tokens")
        return [float(entry[str(token)]["logprob"]) for token, entry in zip(token_ids[1:], entries[1:], strict=True)]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ModelError(f"the [teacher] endpoint's reply has no prompt logprobs for the tokens sent ({exc!r}); "
                         "it must be a vLLM server") from None


class TransformersTeacher:
    """The teacher loaded with transformers in this process (float32), scoring one sequence at a time off the
    event loop; for a teacher small enough to run beside the orchestrator without a server of its own. A VLM's
    folder is loaded with its image processor, the images read by hash from `images`."""

    def __init__(self, model_dir: str, images: ImageSource | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        self.model_dir, self.vlm = model_dir, is_vlm(model_dir)
        loader = AutoModelForImageTextToText if self.vlm else AutoModelForCausalLM
        try:
            self.model = loader.from_pretrained(model_dir, dtype=torch.float32).eval()
        except OSError as exc:
            raise UsageError(f"[teacher] name: cannot load {model_dir!r} with transformers: {exc}") from None
        self.images = ImageInputs.load(model_dir, images) if self.vlm and images is not None else None
        if self.images is not None:
            check_trainable(self.model.config)
        self.lock = asyncio.Lock()  # one forward at a time: parallel ones would only share the same cores

    async def logprobs(self, token_ids: list[int], images: Sequence[ImageSpan] = ()) -> list[float]:
        if images and self.images is None:
            why = "was loaded without an image source" if self.vlm else "takes text only"
            raise UsageError(f"the [teacher] {self.model_dir!r} cannot score a sample with images: it {why}")
        async with self.lock:
            return await asyncio.to_thread(self._logprobs, token_ids, [span.sha256 for span in images])

    def _logprobs(self, token_ids: list[int], images: list[str]) -> list[float]:
        import torch

        with torch.no_grad():
            ids = torch.tensor([token_ids])
            if images and self.images is not None:
                inputs = {"inputs_embeds": self.images.embedded(self.model, ids, images)}
            else:
                inputs = {"input_ids": ids}
            logits = self.model(**inputs, use_cache=False).logits[0, :-1].float()
            picked = logits.gather(-1, ids[0, 1:, None]).squeeze(-1)
            return (picked - torch.logsumexp(logits, dim=-1)).tolist()

    async def aclose(self) -> None:
        return None


# --- reaching and checking ---------------------------------------------------------------------------------------
def reach_teacher(teacher: TeacherModel, endpoints: Endpoints,
                  sleep: Callable[[float], object] = time.sleep) -> Endpoint:
    """The teacher's Endpoint (chat client by default), after checking it answers: `GET /models` tried
    `1 + max_retries` times (each within the probe timeout) with the teacher's backoff, then an
    InfrastructureError naming the endpoint. Its model
    name is `teacher_model`, else the one the endpoint lists first."""
    urls = endpoints.teacher_base_url
    if not urls:
        raise UsageError("endpoints.json names no teacher: set [teacher] base_url (an OpenAI-compatible endpoint)")
    endpoint = teacher.model_copy(update={"base_url": None}).endpoint(urls[0], endpoints.teacher_model or "",
                                                                      replicas=urls[1:])
    for attempt in range(teacher.max_retries + 1):
        try:
            listed = served_models(urls[0], endpoint.api_key(), min(teacher.timeout, PROBE_TIMEOUT_S))
            break
        except Unavailable as exc:
            if attempt == teacher.max_retries:
                raise InfrastructureError(f"the teacher at {urls[0]} ([teacher] base_url) did not answer after "
                                          f"{attempt + 1} tries: {exc}") from None
            sleep(backoff_delay(teacher.backoff, attempt))
    name = endpoints.teacher_model or next((str(m["id"]) for m in listed if "id" in m), None)
    if not name:
        raise InfrastructureError(f"the teacher at {urls[0]} lists no model; set [teacher] name")
    return endpoint.model_copy(update={"model": name})


def build_teacher(teacher: TeacherModel, scorer: str, endpoints: Endpoints,
                  images: ImageSource | None = None) -> Teacher:
    """The teacher that scores an `opd` run's samples: its endpoint (`reach_teacher`), or, with
    `[opd] scorer = "transformers"`, its directory loaded in this process (a VLM's with the samples' images read
    from `images`)."""
    if scorer == "transformers" and teacher.name is not None:  # check_teacher: it is set
        return TransformersTeacher(teacher.name, images)
    return VLLMTeacher(reach_teacher(teacher, endpoints))


def check_teacher(teacher: TeacherModel, scorer: str, student_model: str,
                  student_tokenizer: str | None = None) -> None:
    """For an `opd` run, a UsageError naming `[teacher]` unless the teacher can score (with `[opd] scorer`) and
    tokenizes as the student (the trainer's `student_model`, or `student_tokenizer` when set) does: the same
    vocabulary (a teacher directory), or the same token ids of `PROBE` (a teacher at `base_url`, which must
    answer)."""
    if scorer == "transformers" and teacher.name is None:
        raise UsageError("[opd] scorer = 'transformers' needs [teacher] name (a model directory to load)")
    student = load_tokenizer(student_tokenizer or student_model, "[model]")
    expected = student.encode(PROBE, add_special_tokens=False)
    if teacher.base_url is not None:
        got = endpoint_tokens(teacher, PROBE)
        where = f"the [teacher] endpoint {teacher.base_urls()[0]}"
    else:
        source = teacher.tokenizer or teacher.name or student_model
        tokenizer = load_tokenizer(source, "[teacher]")
        if tokenizer.get_vocab() != student.get_vocab():
            raise UsageError(f"[teacher] name: {source!r} has another vocabulary than the student "
                             f"{student_model!r} ({len(tokenizer)} vs {len(student)} tokens); on-policy "
                             "distillation scores the student's token ids, so both must share one tokenizer")
        got, where = tokenizer.encode(PROBE, add_special_tokens=False), f"[teacher] {source!r}"
    if got != expected:
        raise UsageError(f"{where} tokenizes differently from the student {student_model!r} (a probe "
                         f"text gives {len(got)} vs {len(expected)} tokens); teacher and student must share one "
                         "tokenizer")


def load_tokenizer(source: str, section: str) -> Any:
    """The tokenizer of `source` (a model folder or a hub id); a UsageError naming `section` when it cannot be
    loaded, and saying so plainly when `source` is a folder path that does not exist (the hub's complaint about
    its form would mislead)."""
    from transformers import AutoTokenizer

    if is_folder_path(source) and not Path(source).expanduser().is_dir():
        raise UsageError(f"{section}: {source!r} is no model folder (nothing is there yet?): name a folder with "
                         "the model's weights and tokenizer (an RL run's weights/merged), or a hub id")
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{section}: cannot load the tokenizer of {source!r}: {exc}") from None


def is_folder_path(name: str) -> bool:
    """True when `name` can only be a folder path, not a hub id (`namespace/name`)."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1


def endpoint_tokens(teacher: TeacherModel, text: str) -> list[int]:
    """`text`'s token ids by the teacher's vLLM (`POST /tokenize` at the server root); a UsageError naming the
    endpoint when it does not answer or cannot tokenize."""
    base = teacher.base_urls()[0].rstrip("/")
    root = base.removesuffix("/v1")
    try:
        name = teacher.name or only_served_model(base, teacher.api_key_env)
        body = {"model": name, "prompt": text, "add_special_tokens": False}
        reply = transport.json_object(root, transport.call(f"{root}/tokenize", body, timeout=teacher.timeout))
        return [int(t) for t in reply["tokens"]]
    except (TracegymError, KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"[teacher] base_url: {base} cannot tokenize a probe text ({exc}); the teacher must be a "
                         "running vLLM server") from None
