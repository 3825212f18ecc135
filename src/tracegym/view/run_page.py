"""Run page: a run's summary (or an RL run's steps and curves) above a paged table of its traces or episodes,
with the filter form; built from the index, reading no record from disk."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from typing import Any

from tracegym.view.curves import CURVE_KEYS, curves_svg
from tracegym.view.page import fragment, key_values, note, number, section, table
from tracegym.view.row_query import ERROR_CHOICES, PAGE_SIZES, PHASES, SORT_KEYS, STOP_REASONS, RowQuery
from tracegym.view.run_folder_index import Row, RowKind, RunFolderIndex, RunKind
from tracegym.view.summary_view import summary_html

TRAINER_KEYS = {"trainer/loss": "trainer loss"}
"""The trainer's records drawn below the orchestrator's (their keys prefixed `trainer/`)."""
STEP_COLUMNS = ("reward", "completion_tokens_mean", "staleness", "policy_version", "rollouts", "samples",
                "rollouts_failed", "generation_s")


@dataclass(frozen=True)
class Selection:
    """The rows a query selected: their numbers in order, and the page of them shown."""

    query: RowQuery
    numbers: list[int]
    total: int
    """Rows of that kind in the run, before filtering."""

    @property
    def shown(self) -> list[int]:
        start = (self.query.page - 1) * self.query.per_page
        return self.numbers[start: start + self.query.per_page]

    @property
    def pages(self) -> int:
        return max(1, -(-len(self.numbers) // self.query.per_page))


def select(index: RunFolderIndex, query: RowQuery) -> Selection:
    """The rows of the run that `query` asks for."""
    rows = index.rows(query.show)
    searched = index.search(query.q, query.show) if query.q else None
    return Selection(query, query.select(rows, searched), len(rows))


def run_page(index: RunFolderIndex, selection: Selection) -> str:
    """The body of `/`."""
    parts = [_status(index)]
    if index.kind is RunKind.EVAL:
        parts.append(section("Summary", _summary(index.summary(), index)))
    else:
        parts.append(_rl_sections(index))
    kind = selection.query.show
    live = (f'<a href="/{selection.query.url(live=False)}">stop following</a>' if selection.query.live else
            f'<a href="/{selection.query.url(live=True)}">follow live (reload every few seconds)</a>')
    parts.append(f"<p>{live}</p>")
    parts.append(section("Episodes" if kind is RowKind.EPISODE else "Traces",
                         _filters(index, selection.query) + _count(selection) + _rows_table(index, selection)
                         + _pager(selection), id_="rows"))
    return "".join(parts)


def _status(index: RunFolderIndex) -> str:
    items = [("folder", str(index.path)), ("kind", f"{index.kind.value} run"), *_config_facts(index),
             ("traces", len(index.traces))]
    if index.episodes:
        items.append(("episodes", len(index.episodes)))
    if index.unreadable:
        items.append(("unreadable lines", index.unreadable))
    parts = [key_values((k, v) for k, v in items if v != ""), '<p><a href="#rows">to the table</a></p>']
    if index.pending_bytes:
        parts.append(note(f"indexing: {index.pending_bytes:,} bytes still to read; reload for the rest"))
    parts += [note(line) for line in index.incomplete()]
    return "".join(parts)


def _config_facts(index: RunFolderIndex) -> list[tuple[str, str]]:
    """What the saved config says the run was: an eval run's taskset, an RL run's training and held-out envs,
    and the model (by id or name, never a raw table)."""
    config = index.config()
    if index.kind is RunKind.EVAL:
        facts = [("taskset", _name(config.get("taskset")))]
    else:
        orchestrator = _table(config.get("orchestrator"))
        facts = [("train envs", _names(_table(orchestrator.get("train")).get("envs"))),
                 ("held-out envs", _names(_table(orchestrator.get("eval")).get("envs")))]
    return [*facts, ("model", index.model())]


def _table(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _name(value: Any) -> str:
    """A config entry's id (a string entry as it is)."""
    return value if isinstance(value, str) else str(_table(value).get("id", ""))


def _names(values: Any) -> str:
    return ", ".join(_name(v) for v in values) if isinstance(values, list) else ""


def _summary(summary: dict[str, Any] | None, index: RunFolderIndex) -> str:
    """summary.json's figures as written; while the run has written none, how many rows so far (the figures
    are the run's to compute, once, when it ends)."""
    if summary is None:
        scored = sum(r.reward is not None for r in index.traces)
        return note("no summary.json yet: the run is still going (or was killed before writing it); "
                    "its figures appear when it ends") + key_values([("scored traces so far", scored)])
    return summary_html(summary)


# --- RL runs ---------------------------------------------------------------------------------------------------
def _rl_sections(index: RunFolderIndex) -> str:
    metrics, trainer = index.metrics(), index.trainer_metrics()
    charts = fragment("curves", curves_svg, metrics, CURVE_KEYS) if metrics else ""
    trainer = [{"step": m["step"], **{f"trainer/{k}": v for k, v in m.items() if k != "step"}}
               for m in trainer if isinstance(m, dict) and "step" in m]
    charts += fragment("trainer curves", curves_svg, trainer, TRAINER_KEYS) if trainer else ""
    steps = [m for m in metrics if "step" in m and "invalid_trace" not in m]
    columns = [c for c in STEP_COLUMNS if any(c in m for m in steps)]
    traced, phase = set(index.steps()), "train" if index.held_out_envs() else ""
    rows = [[f'<a href="/{RowQuery(step=m["step"], phase=phase).url()}#rows">{m["step"]}</a>'
             if m["step"] in traced else str(m["step"]), *(number(m.get(c)) for c in columns)] for m in steps]
    bad = [m for m in metrics if "invalid_trace" in m]
    parts = [section("Curves", charts or note("no metrics.jsonl records yet")),
             section("Steps", table(["step", *columns], rows) if rows else note("no steps recorded yet"))]
    if bad:
        parts.append(section("Invalid traces", table(["step", "problem", "count"], [
            [str(m.get("step")), escape(str(m["invalid_trace"])), number(m.get("problems"))] for m in bad])))
    return "".join(parts)


# --- the table -------------------------------------------------------------------------------------------------
def _filters(index: RunFolderIndex, query: RowQuery) -> str:
    tasksets = sorted(t for t in index.tasksets if t)
    fields = [_hidden("show", query.show.value), *([_hidden("live", "1")] if query.live else []),
              _input("reward ≥", "reward_min", query.reward_min), _input("reward ≤", "reward_max", query.reward_max),
              _select("stop reason", "stop", STOP_REASONS, query.stop),
              _select("errors", "error", ERROR_CHOICES, query.error)]
    if len(tasksets) > 1 or query.taskset:
        fields.append(_select("taskset", "taskset", tasksets, query.taskset))
    if index.kind is RunKind.RL:
        fields.append(_select("step", "step", [str(s) for s in index.steps()],
                              "" if query.step is None else str(query.step)))
    if index.held_out_envs():
        fields.append(_select("phase", "phase", PHASES, query.phase))
    fields.append(_input("search messages", "q", query.q, size=24))
    fields += [_select("sort", "sort", list(SORT_KEYS), query.sort, blank=False),
               _select("order", "desc", ["0", "1"], "1" if query.desc else "0", blank=False,
                       labels={"0": "ascending", "1": "descending"}),
               _select("per page", "per_page", [str(n) for n in PAGE_SIZES], str(query.per_page), blank=False),
               '<button type="submit">apply</button>', '<a href="/">clear</a>']
    switch = ""
    if index.episodes and index.traces:
        other = RowKind.TRACE if query.show is RowKind.EPISODE else RowKind.EPISODE
        switch = f'<p><a href="/?show={other.value}#rows">show {other.value}s instead</a></p>'
    return switch + f'<form class="filters" method="get" action="/">{"".join(fields)}</form>'


def _count(selection: Selection) -> str:
    matching, shown = len(selection.numbers), selection.shown
    if not shown:
        return '<p class="muted">no rows match</p>' if selection.total else '<p class="muted">no rows yet</p>'
    start = (selection.query.page - 1) * selection.query.per_page
    return (f'<p class="muted">rows {start + 1:,} to {start + len(shown):,} of {matching:,}'
            f'{" matching" if selection.query.filtered else ""} (the run has {selection.total:,})</p>')


def _rows_table(index: RunFolderIndex, selection: Selection) -> str:
    query = selection.query
    rows = index.rows(query.show)
    episodes = query.show is RowKind.EPISODE
    extra = [*(["step"] if index.kind is RunKind.RL else []), *(["phase"] if index.held_out_envs() else [])]
    show_member = not episodes and any(r.member for r in (rows[n] for n in selection.shown))
    heads = [("#", "line"), ("task", "task"), ("episode" if episodes else "rollout", "index"),
             ("rewards" if episodes else "reward", "reward"), ("stop reason", "stop"), ("errors", "errors"),
             ("turns", "turns"), ("tokens in / out", "tokens"), ("duration (s)", "duration")]
    heads += [(c, c) for c in extra]
    heads.append(("taskset", "taskset"))
    head = [_sort_link(query, label, key) for label, key in heads] + (["member"] if show_member else [])
    body, classes = [], []
    for n in selection.shown:
        row = rows[n]
        body.append(_cells(index, n, row, episodes, extra, show_member))
        classes.append("problem" if row.problem else "")
    return table(head, body, classes=classes) if body else ""


def _cells(index: RunFolderIndex, n: int, row: Row, episodes: bool, extra: list[str], show_member: bool
           ) -> list[str]:
    """A row's cells; the `extra` columns (`step`, `phase`) before the taskset."""
    link = f'<a href="/{"episode" if episodes else "trace"}/{n}">{n}</a>'
    if row.problem is not None:
        width = 8 + len(extra)
        return [link, f'<span class="err">{escape(index.where(row))}: {escape(row.problem)}</span>',
                *[""] * width, *([""] if show_member else [])]
    reward = ", ".join(f"{escape(m)} {number(r)}" for m, r in row.member_rewards) if episodes else number(row.reward)
    cells = [link, escape(row.task_key), str(row.index), reward, escape(row.stop_reason),
             f'<span class="err">{escape(", ".join(row.errors))}</span>' if row.errors else "",
             str(row.turns), f"{row.prompt_tokens} / {row.completion_tokens}", number(row.duration)]
    phase = escape(f"held-out {row.held_out}") if row.held_out else "train"
    cells += [phase if c == "phase" else "" if row.step is None else str(row.step) for c in extra]
    cells.append(escape(row.taskset))
    if show_member:
        cells.append(escape(row.member or ""))
    return cells


def _pager(selection: Selection) -> str:
    query, pages = selection.query, selection.pages
    if pages <= 1:
        return ""
    links = []
    for page in sorted({1, query.page - 1, query.page, query.page + 1, pages} & set(range(1, pages + 1))):
        links.append(f"<span>{page}</span>" if page == query.page
                     else f'<a href="/{query.url(page=page)}#rows">{page}</a>')
    return f'<nav class="pages">page {" ".join(links)} of {pages:,}</nav>'


def _sort_link(query: RowQuery, label: str, key: str) -> str:
    desc = not query.desc if query.sort == key else key in ("reward", "errors", "turns", "tokens", "duration")
    arrow = (" ↓" if query.desc else " ↑") if query.sort == key else ""
    return f'<a href="/{query.url(sort=key, desc=desc, page=1)}#rows">{escape(label)}{arrow}</a>'


def _input(label: str, name: str, value: Any, size: int = 6) -> str:
    shown = "" if value is None else escape(str(value))
    return f'<label>{escape(label)}<input name="{name}" value="{shown}" size="{size}"></label>'


def _hidden(name: str, value: str) -> str:
    return f'<input type="hidden" name="{name}" value="{escape(value)}">'


def _select(label: str, name: str, options: Iterable[str], chosen: str, *, blank: bool = True,
            labels: dict[str, str] | None = None) -> str:
    labels = labels or {}
    items = ['<option value="">any</option>'] if blank else []
    items += [f'<option value="{escape(o)}"{" selected" if o == chosen else ""}>{escape(labels.get(o, o))}</option>'
              for o in options]
    return f'<label>{escape(label)}<select name="{name}">{"".join(items)}</select></label>'
