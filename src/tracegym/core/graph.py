"""Message graph: a trace's messages as nodes with parent links; each root-to-leaf path is a branch.

Nodes hold only the tokens they add. An assistant node produced by the model holds the prompt tokens that
appeared since the previous tokenized node (mask 0) followed by its sampled completion (mask 1), so the tokens
along a branch concatenate to exactly what the model saw and sampled on that branch's last turn. When a new
prompt does not extend the branch's tokens (the template re-rendered an earlier turn differently), the graph
forks: the conversation is copied into a new branch whose first model node carries the whole new prompt. A copy
is not marked sampled (its tokens are the original's, and in the new branch they are prompt): it names the node
it copies (`copy_of`), so a node marked sampled always carries its tokens when the client returned any.
The current branch's tokens are cached, so a turn's Python work is in its new tokens only; checking that its
prompt extends the branch is one C-level list comparison (~1 ns a token), exact wherever a full render differs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field, PrivateAttr

from tracegym.core.messages import Message
from tracegym.core.record import Record

RoutedExperts = list[list[list[int]]]
"""On an MoE model: the experts each token was routed to, `[token][MoE layer][k]`; `[]` for a token never forwarded."""


class ImageSpan(Record):
    """Where one image's placeholder run lies in a token list (the run the model's processor expands the image
    into), and which image it is: the sha256 of the image's bytes."""

    model_config = ConfigDict(frozen=True)
    offset: int
    """The run's first token, counted from the start of the token list it is in (a node's: its own tokens)."""
    length: int
    sha256: str


class Node(Record):
    """One message in the graph, with the tokens it adds when they are known."""

    model_config = ConfigDict(frozen=True)
    id: int
    parent: int | None
    message: Message
    sampled: bool = False
    """True when the model produced this message."""
    token_ids: list[int] | None = None
    mask: list[int] | None = None
    """1 for each sampled token, 0 for prompt tokens; aligned with token_ids."""
    logprobs: list[float] | None = None
    """Sampling logprob per token (0.0 where not sampled); aligned with token_ids. None on a model turn whose
    client returned no logprobs (`validate` reports it: such a turn cannot be trained on)."""
    temperature: float | None = None
    """The sampling temperature of the call that produced this node."""
    policy_version: int | None = None
    """The policy version that sampled this node, when the endpoint reported it."""
    copy_of: int | None = None
    """On a fork's copy: the node it copies (the first original, on an earlier branch). A copied model turn is not
    marked sampled: its tokens are on the original, and on this branch they are part of the next prompt."""
    parse_error: bool = False
    """The reply's markup did not parse (an unclosed or stray `<think>` tag in an episode): the turn stands, its
    tokens stay on the branch, but training gives them no loss."""
    images: list[ImageSpan] = Field(default_factory=list, exclude_if=lambda spans: not spans)
    """The placeholder runs of the images among this node's tokens (offsets into `token_ids`), in order; empty on
    a text-only turn."""
    routed_experts: RoutedExperts | None = Field(default=None, exclude_if=lambda routing: routing is None)
    """On an MoE model whose server returned them: the experts the sampler routed each token to, aligned with
    token_ids (the completion's last token was never forwarded: `[]`). The trainer forces the same routing."""


@dataclass(frozen=True)
class TokenPrefix:
    """The exact tokens along a branch, for a model client that extends them rather than re-render the
    conversation (the renderer's bridge): which messages they cover and which of them the model last sampled."""

    token_ids: list[int]
    covered_messages: int
    """How many of the conversation's messages the tokens cover; the rest are new since the model's last turn."""
    completion_length: int
    """How many of the last tokens the model sampled on its previous turn (that turn's completion)."""

    def __post_init__(self) -> None:
        if not (self.covered_messages > 0 and 0 < self.completion_length <= len(self.token_ids)):
            raise ValueError(f"a token prefix covers at least one message and ends with a completion of 1 to "
                             f"{len(self.token_ids)} tokens, not {self.covered_messages} messages, "
                             f"{self.completion_length} sampled")

    @property
    def prompt_ids(self) -> list[int]:
        """The tokens before the last completion."""
        return self.token_ids[: len(self.token_ids) - self.completion_length]

    @property
    def completion_ids(self) -> list[int]:
        """The tokens the model sampled on its previous turn."""
        return self.token_ids[len(self.token_ids) - self.completion_length :]


@dataclass
class _BranchCache:
    """The newest tokenized node of the current branch and its path's tokens (grown in place by
    `add_model_turn`), with their count when cached: a copy of the graph shares the list, sees another length
    and rebuilds."""

    node: Node
    tokens: list[int]
    length: int

    def holds(self, node: Node) -> bool:
        """True when this cache is still the tokens up to `node`."""
        return self.node is node and len(self.tokens) == self.length


class MessageGraph(Record):
    """The nodes of one rollout, appended in order; the newest node ends the current branch."""

    nodes: list[Node] = Field(default_factory=list)
    _branch: _BranchCache | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        """Graphs are equal when their nodes are (the token cache is not part of the value)."""
        if not isinstance(other, MessageGraph):
            return NotImplemented
        return self.nodes == other.nodes

    # no __hash__: with __eq__ defined here, Python sets it to None (mutable, like the pydantic model it overrides)

    @property
    def head(self) -> int | None:
        """Id of the newest node: the end of the branch the rollout is on."""
        return self.nodes[-1].id if self.nodes else None

    def add(self, message: Message, parent: int | None = -1, **fields: Any) -> Node:
        """Append a node; `parent=-1` means the current head."""
        if parent == -1:
            parent = self.head
        node = Node(id=len(self.nodes), parent=parent, message=message, **fields)
        self.nodes.append(node)
        return node

    def path(self, node_id: int | None = None) -> list[Node]:
        """The nodes from the root to `node_id` (default: the head)."""
        out: list[Node] = []
        current = self.head if node_id is None else node_id
        while current is not None:
            node = self.nodes[current]
            out.append(node)
            current = node.parent
        return out[::-1]

    def messages(self, node_id: int | None = None) -> list[Message]:
        """The conversation along the path to `node_id` (default: the head)."""
        return [n.message for n in self.path(node_id)]

    def leaves(self) -> list[int]:
        """Ids of nodes nobody points to, in order of creation."""
        parents = {n.parent for n in self.nodes}
        return [n.id for n in self.nodes if n.id not in parents]

    def branches(self) -> list[list[int]]:
        """Every root-to-leaf path as a list of node ids."""
        return [[n.id for n in self.path(leaf)] for leaf in self.leaves()]

    def tokens(self, node_id: int | None = None) -> list[int]:
        """The token ids along the path to `node_id`, concatenated (nodes without tokens add none)."""
        if node_id is None or node_id == self.head:
            return list(self._branch_tokens())
        return self._path_tokens(node_id)

    def _path_tokens(self, node_id: int | None) -> list[int]:
        out: list[int] = []
        for node in self.path(node_id):
            if node.token_ids:
                out.extend(node.token_ids)
        return out

    def prefix_split(self, node_id: int | None = None) -> tuple[int, int]:
        """For the path to `node_id` (default: the head): how many of its messages the token prefix covers,
        and how many of the prefix's last tokens were sampled (the last model turn's completion)."""
        path = self.path(node_id)
        for index in range(len(path) - 1, -1, -1):
            node = path[index]
            if node.token_ids:
                sampled = 0
                if node.sampled and node.mask:
                    while sampled < len(node.mask) and node.mask[-1 - sampled] == 1:
                        sampled += 1
                return index + 1, sampled
        return 0, 0

    def token_prefix(self) -> TokenPrefix | None:
        """The head's branch tokens as a TokenPrefix; None until the branch has a sampled completion."""
        covered, sampled = self.prefix_split()
        return TokenPrefix(self.tokens(), covered, sampled) if sampled else None

    def add_model_turn(
        self,
        message: Message,
        prompt_ids: list[int] | None = None,
        completion_ids: list[int] | None = None,
        completion_logprobs: list[float] | None = None,
        temperature: float | None = None,
        policy_version: int | None = None,
        parse_error: bool = False,
        prompt_images: Iterable[ImageSpan] = (),
        routed_experts: RoutedExperts | None = None,
    ) -> Node:
        """Append the model's reply to the head, placing its tokens; forks when the prompt drifted.
        `prompt_images`: the image runs in `prompt_ids` (offsets into it); those among the new tokens go on the
        node (those before are on the nodes that added them). `routed_experts`: the call's routing of
        `prompt_ids + completion_ids[:-1]`, as vLLM returns it."""
        if prompt_ids is None or completion_ids is None:
            return self.add(message, sampled=True, temperature=temperature, policy_version=policy_version,
                            parse_error=parse_error)
        prompt_ids = prompt_ids if isinstance(prompt_ids, list) else list(prompt_ids)  # a list compares to lists
        prefix = self._branch_tokens()
        parent, known = self.head, len(prefix)
        prefix += prompt_ids[known:]  # so one C-level comparison, without copying the prompt, checks the prefix
        if prefix != prompt_ids:  # the prompt does not extend the branch (a full render may differ anywhere)
            del prefix[known:]
            parent, prefix, known = self._fork(), list(prompt_ids), 0
        delta = prompt_ids[known:]
        images = [span.model_copy(update={"offset": span.offset - known}) for span in prompt_images
                  if span.offset >= known]
        logprobs = None if completion_logprobs is None else [0.0] * len(delta) + list(completion_logprobs)
        node = self.add(
            message,
            parent=parent,
            sampled=True,
            token_ids=delta + completion_ids,
            mask=[0] * len(delta) + [1] * len(completion_ids),
            logprobs=logprobs,
            temperature=temperature,
            policy_version=policy_version,
            parse_error=parse_error,
            images=images,
            routed_experts=_node_routing(routed_experts, known, len(delta) + len(completion_ids)),
        )
        prefix += completion_ids
        self._branch = _BranchCache(node, prefix, len(prefix))
        return node

    def _branch_tokens(self) -> list[int]:
        """The head's branch tokens: the cache when it is for the newest tokenized node on the head's path,
        else rebuilt (and cached). Callers must not mutate the result (add_model_turn grows it in place)."""
        cached, node_id = self._branch, self.head
        while node_id is not None:
            node = self.nodes[node_id]
            if cached is not None and cached.holds(node):
                return cached.tokens
            if node.token_ids:
                break
            node_id = node.parent
        if node_id is None:
            return []
        tokens = self._path_tokens(node_id)
        self._branch = _BranchCache(self.nodes[node_id], tokens, len(tokens))
        return tokens

    def image_spans(self, node_id: int | None = None) -> list[ImageSpan]:
        """The image runs along the path to `node_id` (default: the head), offsets into `tokens(node_id)`."""
        out: list[ImageSpan] = []
        start = 0
        for node in self.path(node_id):
            out.extend(span.model_copy(update={"offset": start + span.offset}) for span in node.images)
            start += len(node.token_ids or ())
        return out

    def oldest_version(self, nodes: Iterable[Node] | None = None) -> int | None:
        """The oldest policy version among these nodes' sampled turns (default: every node's; None when none
        reported one)."""
        known = [n.policy_version for n in (self.nodes if nodes is None else nodes)
                 if n.sampled and n.policy_version is not None]
        return min(known) if known else None

    def is_model_turn(self, node: Node) -> bool:
        """Whether the model wrote this node: sampled here, or a fork's copy of a node it sampled."""
        return node.sampled or (node.copy_of is not None and self.nodes[node.copy_of].sampled)

    def copied_turns(self) -> int:
        """Model turns copied into a later branch by forks (not marked sampled there: see `Node.copy_of`)."""
        return sum(1 for n in self.nodes if n.copy_of is not None and self.nodes[n.copy_of].sampled)

    def _fork(self) -> int | None:
        """Copy the current conversation, without tokens and not marked sampled, into a new branch; returns its
        last node id."""
        parent: int | None = None
        for node in self.path():
            original = node.id if node.copy_of is None else node.copy_of
            parent = self.add(node.message, parent=parent, copy_of=original, policy_version=node.policy_version).id
        return parent


def _node_routing(call: RoutedExperts | None, known: int, count: int) -> RoutedExperts | None:
    """A node's share of its call's routing: from position `known` on, `[]` for the tokens it does not cover."""
    if call is None:
        return None
    own = call[known:known + count]
    return own + [[] for _ in range(count - len(own))]
