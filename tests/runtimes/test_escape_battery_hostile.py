"""The hostile escape battery (issue 32): every row of the sandbox audit, under every runtime, as root (in this
process) and as an unprivileged user made for the session (slow: see `unprivileged`). A row passes with 0
escapes and 0 leftovers (`escape_rows` says what each row does and finds).

A row that escapes on today's code is marked in KNOWN_ESCAPES: an expected failure, strict (a row that stops
escaping fails until its mark is removed) and only by an escape (`Escaped`: a row that breaks otherwise fails).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from escape_rows import RUNTIME_IDS, Props, Verdict, listening_socket, run_row
from reward_hack import install_roots, solution
from unprivileged import TestUser, create_test_user, delete_test_user, find_python, give_container_image

from tracegym.runtimes.container_image import BuiltImage
from tracegym.tasksets.function_problems import FAMILIES

USERS = ("root", "user")
PATH_SOCKET_FOLDERS = ("/run/lock", "/run", "/tmp")
GROUP = ("subprocess-process-group",)
SUBPROCESS = ("subprocess", *GROUP)
ALL = (*SUBPROCESS, "bubblewrap")
KNOWN_ESCAPES: dict[tuple[str, str, str], str] = {
    (row, runtime_id, user): leak
    for row, runtime_ids, users, leak in (
        ("grader_readable", GROUP, USERS, "no view: function_problems.py, the tracegym package, the checkout"),
        ("hidden_tests_listable", GROUP, USERS, "no view: the host's /tmp (a hidden-tests folder in it) is visible"),
        ("home_secret", GROUP, ("user",), "no view: the user's home and its 0600 secret are readable"),
        ("sibling_workdir", GROUP, ("user",), "no view: a sibling sandbox's workdir (same uid) is readable"),
        ("same_uid_socket", GROUP, ("user",), "no view: the user's own sockets in /tmp and its home are connectable"),
        ("supplementary_group", GROUP, ("user",), "no view: a 0660 group-owned socket and file are reached"),
        ("scratch_leftovers", GROUP, ("user",), "files written in /tmp, /var/tmp, /dev/shm outlive the close"),
        ("disk_cap", GROUP, ("user",), "no namespaces: the sandbox's files are uncapped (no tmpfs of ours)"),
        ("disk_cap", GROUP, ("root",), "no view: /tmp, /var/tmp, /dev/shm are the host's, outside the cap"),
        ("kill_all", GROUP, ("user",), "kill(-1, SIGKILL) kills the host's own processes"),
        ("proc_environ", GROUP, USERS, "/proc/*/cmdline (and the user's environ) readable"),
        ("loopback_port", GROUP, USERS, "no network namespace: the host's 127.0.0.1 reached"),
        ("path_socket", GROUP, USERS, "no view: 0777 sockets under /run/lock, /run and /tmp connectable"),
        ("device_nodes", GROUP, USERS, "no view: the host's /dev (every device node) is visible"),
    )
    for runtime_id in runtime_ids for user in users
}
"""(row, runtime id, user) -> what leaks there today: what the process-group fallback does not isolate (it is only
given when asked for by name, with a warning), and what an unprivileged user cannot cap (no tmpfs of ours; its
memory and processes are capped by the cgroup root delegates to it, see `unprivileged`). Remove an entry as its
fix lands (its test then passes; while the entry stays, a pass fails as an unexpected one)."""


class Escaped(AssertionError):
    """A row found escapes or leftovers."""


def cases(row: str, users: tuple[str, ...] = USERS, runtimes: tuple[str, ...] = RUNTIME_IDS,
          slow: bool = False) -> list[object]:
    """pytest params (runtime id, user) of `row`: the unprivileged ones slow (all of them where `slow`), today's
    escapes expected."""
    params: list[object] = []
    for runtime_id in runtimes:
        for user in users:
            marks = [pytest.mark.slow] if slow or user == "user" else []
            if (row, runtime_id, user) in KNOWN_ESCAPES:
                marks.append(pytest.mark.xfail(strict=True, raises=Escaped,
                                               reason=f"issue 32: {KNOWN_ESCAPES[row, runtime_id, user]}"))
            params.append(pytest.param(runtime_id, user, id=f"{runtime_id}-{user}", marks=marks))
    return params


@pytest.fixture(scope="session")
def host_props() -> Iterator[Props]:
    """What root makes for every row: listening 0777 sockets under /run/lock, /run and /tmp, and a world-readable
    folder of hidden tests outside every workdir."""
    if os.geteuid() != 0:
        pytest.skip("the battery makes host sockets in /run and a test user: it needs root")
    hidden = Path(tempfile.mkdtemp(prefix="tg-battery-hidden-"))
    hidden.chmod(0o755)
    (hidden / "tests_hidden.py").write_text("assert solve(2) == 4  # tg-battery-secret-hidden-test\n")
    name = f"tg-battery-{secrets.token_hex(4)}.sock"
    paths = [Path(folder) / name for folder in PATH_SOCKET_FOLDERS]
    servers = [listening_socket(path, 0o777) for path in paths]
    try:
        yield Props(checkout=str(Path(__file__).parents[2]), hidden_dir=str(hidden),
                    path_sockets=[*map(str, paths), f"/var/run/{name}"])
    finally:
        for server, path in zip(servers, paths, strict=True):
            server.close()
            path.unlink(missing_ok=True)
        shutil.rmtree(hidden, ignore_errors=True)


@pytest.fixture(scope="session")
def test_user(request: pytest.FixtureRequest, host_props: Props) -> Iterator[TestUser]:
    """The unprivileged user of the session, with root's container image in its own rootless podman's store
    (where root has it), deleted at its end whatever happened."""
    user = create_test_user(host_props)
    try:
        why = find_python(user)
        if why:
            pytest.skip(why)
        give_image(request, user)
        yield user
    finally:
        delete_test_user(user)


def give_image(request: pytest.FixtureRequest, user: TestUser) -> None:
    """Root's container image (built for the session) loaded into the user's store; where it cannot be, the
    user's container rows skip, saying why."""
    try:
        built: BuiltImage = request.getfixturevalue("container_image")
    except pytest.skip.Exception as exc:
        user.unavailable["container"] = f"root has no container image to give the test user: {exc}"
        return
    why = give_container_image(user, built.engine, built.image)
    if why:
        user.unavailable["container"] = why


async def verdict_of(request: pytest.FixtureRequest, row: str, runtime_id: str, user: str) -> Verdict:
    """Row `row` under `runtime_id`, in this process (root) or as the test user."""
    props: Props = request.getfixturevalue("host_props")
    if user == "root":
        return await run_row(row, runtime_id, props)
    as_user: TestUser = request.getfixturevalue("test_user")
    return await as_user.run_row(row, runtime_id)


async def contained(request: pytest.FixtureRequest, row: str, runtime_id: str, user: str) -> None:
    """Fail with Escaped when the row finds escapes or leftovers (skip where its runtime is unavailable)."""
    verdict = await verdict_of(request, row, runtime_id, user)
    if verdict.broken:  # the program never ran (bwrap loses a race with a concurrent sandbox's mounts): once more
        verdict = await verdict_of(request, row, runtime_id, user)
    if verdict.skipped:
        pytest.skip(verdict.skipped)
    assert verdict.broken is None, f"the row did not run as meant: {verdict.broken}"
    if verdict.escapes or verdict.leftovers:
        raise Escaped(f"{len(verdict.escapes)} escape(s), {len(verdict.leftovers)} leftover(s): "
                      f"{[*verdict.escapes, *verdict.leftovers]}")


# 1. memory: one cap per sandbox, not per process (slow: each run fills 1.2 GB of host RAM)

@pytest.mark.parametrize(("runtime_id", "user"), cases("aggregate_memory", slow=True))
async def test_aggregate_memory_of_a_sandbox_stays_under_its_cap(request: pytest.FixtureRequest, runtime_id: str,
                                                                 user: str) -> None:
    await contained(request, "aggregate_memory", runtime_id, user)


@pytest.mark.parametrize(("runtime_id", "user"), cases("aggregate_memory_default", slow=True))
async def test_aggregate_memory_stays_under_the_default_cap(request: pytest.FixtureRequest, runtime_id: str,
                                                            user: str) -> None:
    await contained(request, "aggregate_memory_default", runtime_id, user)


@pytest.mark.slow
@pytest.mark.parametrize("runtime_id", ["subprocess", "bubblewrap", "container"])
async def test_without_a_delegated_cgroup_the_result_and_one_warning_say_memory_is_per_process(
        test_user: TestUser, runtime_id: str) -> None:
    """The user's runner given no cgroup (a fresh runner: the warning is once per process)."""
    with test_user.without_delegation():
        verdict = await test_user.run_row("memory_scope_said", runtime_id)
    if verdict.skipped:
        pytest.skip(verdict.skipped)
    assert verdict.broken is None and not verdict.escapes and not verdict.leftovers, verdict


@pytest.mark.slow
@pytest.mark.parametrize("runtime_id", ["subprocess", "bubblewrap", "container"])
async def test_an_allow_listed_host_port_is_reached_as_the_user(test_user: TestUser, runtime_id: str) -> None:
    """The relay's folder reaches the sandbox where the keeper's tmpfs (or, rootless podman, the one in its pause
    process's namespaces) covers the sandbox's folder."""
    verdict = await test_user.run_row("egress_reached", runtime_id)
    if verdict.skipped:
        pytest.skip(verdict.skipped)
    assert verdict.broken is None and not verdict.escapes and not verdict.leftovers, verdict


# 2. the grader is not on any path the sandbox sees

@pytest.mark.parametrize(("runtime_id", "user"), cases("grader_readable"))
async def test_grader_source_is_unreadable(request: pytest.FixtureRequest, runtime_id: str, user: str) -> None:
    await contained(request, "grader_readable", runtime_id, user)


@pytest.mark.parametrize(("runtime_id", "user"), cases("hidden_tests_listable"))
async def test_hidden_test_files_are_unlistable(request: pytest.FixtureRequest, runtime_id: str, user: str) -> None:
    await contained(request, "hidden_tests_listable", runtime_id, user)


# 3. what a non-root deployment must keep

@pytest.mark.parametrize(("runtime_id", "user"), cases("home_secret", users=("user",)))
async def test_home_secret_is_unreadable(request: pytest.FixtureRequest, runtime_id: str, user: str) -> None:
    await contained(request, "home_secret", runtime_id, user)


@pytest.mark.parametrize(("runtime_id", "user"), cases("sibling_workdir"))
async def test_sibling_sandbox_workdir_is_unreadable(request: pytest.FixtureRequest, runtime_id: str,
                                                     user: str) -> None:
    await contained(request, "sibling_workdir", runtime_id, user)


@pytest.mark.parametrize(("runtime_id", "user"), cases("same_uid_socket", users=("user",)))
async def test_same_uid_unix_socket_is_unreachable(request: pytest.FixtureRequest, runtime_id: str,
                                                   user: str) -> None:
    await contained(request, "same_uid_socket", runtime_id, user)


@pytest.mark.parametrize(("runtime_id", "user"), cases("supplementary_group", users=("user",)))
async def test_supplementary_groups_are_dropped(request: pytest.FixtureRequest, runtime_id: str, user: str) -> None:
    await contained(request, "supplementary_group", runtime_id, user)


@pytest.mark.parametrize(("runtime_id", "user"), cases("scratch_leftovers"))
async def test_scratch_files_are_gone_after_close(request: pytest.FixtureRequest, runtime_id: str,
                                                  user: str) -> None:
    await contained(request, "scratch_leftovers", runtime_id, user)


@pytest.mark.parametrize(("runtime_id", "user"), cases("disk_cap"))
async def test_one_disk_cap_holds_workdir_and_scratch_folders(request: pytest.FixtureRequest, runtime_id: str,
                                                              user: str) -> None:
    await contained(request, "disk_cap", runtime_id, user)


@pytest.mark.parametrize(("runtime_id", "user"), cases("kill_all"))
async def test_kill_minus_one_spares_host_processes(request: pytest.FixtureRequest, runtime_id: str,
                                                    user: str) -> None:
    await contained(request, "kill_all", runtime_id, user)


@pytest.mark.parametrize(("runtime_id", "user"), cases("proc_environ"))
async def test_proc_environ_and_cmdline_of_others_are_unreadable(request: pytest.FixtureRequest, runtime_id: str,
                                                                 user: str) -> None:
    await contained(request, "proc_environ", runtime_id, user)


@pytest.mark.parametrize(("runtime_id", "user"), cases("loopback_port"))
async def test_host_loopback_port_is_unreachable(request: pytest.FixtureRequest, runtime_id: str, user: str) -> None:
    await contained(request, "loopback_port", runtime_id, user)


@pytest.mark.parametrize(("runtime_id", "user"), cases("daemon_left"))
async def test_no_daemon_outlives_the_close(request: pytest.FixtureRequest, runtime_id: str, user: str) -> None:
    await contained(request, "daemon_left", runtime_id, user)


# 4. "no network" covers path-based Unix sockets

@pytest.mark.parametrize(("runtime_id", "user"), cases("path_socket"))
async def test_path_unix_sockets_are_unreachable(request: pytest.FixtureRequest, runtime_id: str, user: str) -> None:
    await contained(request, "path_socket", runtime_id, user)


# 6. a child holding stdout does not hold the run

@pytest.mark.parametrize(("runtime_id", "user"), cases("pipe_holding_child"))
async def test_run_returns_when_the_program_exits_despite_a_child_holding_stdout(
        request: pytest.FixtureRequest, runtime_id: str, user: str) -> None:
    await contained(request, "pipe_holding_child", runtime_id, user)


# 9. device nodes

@pytest.mark.parametrize(("runtime_id", "user"), cases("device_nodes"))
async def test_dev_holds_only_the_minimal_devices(request: pytest.FixtureRequest, runtime_id: str, user: str) -> None:
    await contained(request, "device_nodes", runtime_id, user)


# the reward-hack reply

def test_reward_hack_reply_binds_every_reference_solution_where_the_grader_is_readable(tmp_path: Path) -> None:
    """The control: run where function_problems.py is readable (on the host, by the sandbox's python3), the
    reply binds a right function for every family, so its 0 in a sandbox means the grader was hidden."""
    (tmp_path / "solution.py").write_text(solution(install_roots()))
    calls = [(f.name, f.test(random.Random(7))) for f in FAMILIES]
    check = ("import json, sys\nimport solution\nassert solution.FOUND, 'found no grader'\n"
             "for name, args in json.loads(sys.argv[1]):\n    print(json.dumps(getattr(solution, name)(*args)))")
    done = subprocess.run([shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable, "-I",
                           "-c", f"import sys; sys.path.insert(0, '.')\n{check}",
                           json.dumps([(n, t.args) for n, t in calls])],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [t.expected for _, t in calls]


@pytest.mark.slow
@pytest.mark.parametrize(("runtime_id", "user"), cases("reward_hack", runtimes=("bubblewrap", "subprocess")))
async def test_reward_hack_reply_scores_zero(request: pytest.FixtureRequest, runtime_id: str, user: str) -> None:
    """Through real python-functions rollouts (bubblewrap: the default runtime), in this process or the user's."""
    await contained(request, "reward_hack", runtime_id, user)
