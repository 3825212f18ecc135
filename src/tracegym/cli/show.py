"""`tracegym show RUN_DIR [-n N]`: a run's summary and a few of its traces (its episodes' members'), readable; of a
combined run (several tasksets), the combined table."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from tracegym.config.image_store import ImageStore
from tracegym.core.errors import UsageError
from tracegym.core.image_ref import decoded, image_ref, storable, stored_name
from tracegym.core.judgment import Judgment
from tracegym.core.messages import ImagePart
from tracegym.core.trace import Trace
from tracegym.eval.combined_folder import CombinedFolder
from tracegym.eval.combined_summary import combined_table
from tracegym.eval.eval_config import EvalConfig, validate_saved
from tracegym.eval.run_folder import EPISODES, TRACES, RunFolder
from tracegym.eval.run_summary import run_table, summarize_run

ROLE_STYLE = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "yellow"}
SHOWN_REPLY = 120
"""Characters of a judge's reply shown."""


def run(args: list[str]) -> int:
    """Show the folder named first; `-n N` traces (default 3), errored ones first."""
    if not args or args[0].startswith("-"):
        raise UsageError("usage: tracegym show RUN_DIR [-n N]")
    count = _count(args[1:])
    combined = CombinedFolder.open_if_combined(Path(args[0]))
    if combined is not None:  # several tasksets: their table; each one's traces with `show` of its folder
        Console().print(combined_table(combined.summary(), title=str(combined.path)))
        print(f"each taskset's run: tracegym show {combined.path}/<taskset>")
        return 0
    folder = RunFolder.open(Path(args[0]))
    stored = folder.log.read()
    config = validate_saved(EvalConfig, folder.read_config(), str(folder.config_path))  # no taskset import
    summary = summarize_run(stored.episodes, pass_threshold=config.pass_threshold, cuts=config.cuts)
    console = Console()
    console.print(run_table(summary, title=str(folder.path)))
    if stored.truncated_tail:
        console.print(f"[yellow]the last line of {TRACES} or {EPISODES} is cut off (killed mid-write); --resume "
                      "redoes it[/]")
    if stored.bad_lines:
        console.print(f"[yellow]{stored.bad_lines} line(s) of {TRACES} or {EPISODES} could not be read (corrupt) and "
                      "were skipped; --resume reruns their episodes[/]")
        for path, why in stored.problems.items():
            console.print(f"[yellow]  {path.name} {why}[/]")
    if stored.cut_short:
        console.print(f"[yellow]{stored.cut_short} episode(s) were cut short (their traces have no record); "
                      "--resume reruns them[/]")
    if folder.images.missing:
        console.print(f"[yellow]{len(folder.images.missing)} image(s) the traces name are missing from "
                      f"{folder.images.folder}[/]")
    picked = sorted(stored.traces, key=lambda t: (t.ok, t.task_key, t.rollout_index))[:count]
    for trace in picked:
        console.print(trace_panel(trace, folder.images))
    return 0


def trace_panel(trace: Trace, images: ImageStore | None = None) -> Panel:
    """One trace: its messages (each image as a line naming its file in `images`, or its URL), rewards, stop
    reason, judge calls and errors."""
    parts: list[Text] = []
    for message in trace.messages:
        text = "".join(f"[{image_line(p, images)}]\n" for p in message.content or ()
                       if isinstance(p, ImagePart)) + message.text
        for call in message.tool_calls:
            text += f"\n→ {call.name}({call.arguments})"
        parts.append(Text(f"{message.role}: ", style=f"bold {ROLE_STYLE[message.role]}") + Text(text))
    rewards = ", ".join(f"{k}={'-' if v.score is None else f'{v.score:.3f}'}" for k, v in trace.rewards.items())
    parts.append(Text(f"reward {trace.reward}  ({rewards})  stop: {trace.stop_reason}"
                      f"{' by ' + trace.stopped_by if trace.stopped_by else ''}  tokens: "
                      f"{trace.usage.prompt_tokens} in, {trace.usage.completion_tokens} out", style="bold"))
    for judgment in trace.judgments:
        parts.append(Text(judged(judgment), style="cyan"))
    for error in trace.errors:
        parts.append(Text(f"{error.kind.value} error in {error.stage}: {error.message}", style="red"))
    member = f" {trace.member}" if trace.member else ""
    return Panel(Group(*parts), title=f"{trace.task_key}#{trace.rollout_index}{member}", title_align="left")


def image_line(part: ImagePart, images: ImageStore | None) -> str:
    """An image as `show` prints it: the run folder's file that holds it (`image images/<sha256>.png, N bytes`),
    else what it is (inline data of N bytes, a URL, a reference whose file is missing)."""
    url = part.image_url.get("url", "")
    try:
        found = decoded(url)
    except ValueError as exc:
        return f"image: unreadable data URI: {exc}"
    if found is None:
        return f"image missing: {url}" if stored_name(url) else f"image: {url[:200]}"
    size = f"{len(found[1]):,} bytes"
    name = stored_name(image_ref(found[1])) if storable(url) is not None else None
    if images is not None and name is not None and images.path(name) is not None:
        return f"image {images.folder.name}/{name}, {size}"
    return f"image: inline {found[0]}, {size}"


def judged(judgment: Judgment) -> str:
    """One judge call on a trace: the judge, its model, the score read (cached or not) and the reply, shortened."""
    score = "-" if judgment.score is None else f"{judgment.score:g}"
    reply = "(no reply)" if judgment.reply is None else repr(" ".join(judgment.reply.split())[:SHOWN_REPLY])
    return (f"judge {judgment.judge} ({judgment.model}): {score}{' (cached)' if judgment.cached else ''}, "
            f"said {reply}")


def _count(args: list[str]) -> int:
    if not args:
        return 3
    if len(args) == 2 and args[0] in ("-n", "--num") and args[1].isdigit():
        return int(args[1])
    raise UsageError(f"tracegym show: unexpected arguments {' '.join(args)!r} (only -n N)")
