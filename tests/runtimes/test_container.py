"""The container runtime: which engine is found (fake engines on PATH, and the real one), the image that is built
here and never pulled, the command line a run is (the scratch folders of the one disk cap, containers made ahead),
and (slow) real containers: what a program in one can do, the memory cap over the whole run, nothing left after
close, a run in a container made ahead, and an agent program reaching the proxy from inside.
The escape battery and the sandbox contract also run under it (sandbox_helpers.runtimes)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from runtime_helpers import wait_until

from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import StopReason
from tracegym.envs.harness import ProgramHarness
from tracegym.envs.rollout import rollout
from tracegym.envs.scorers import reward
from tracegym.envs.task import Task
from tracegym.runtimes.container import (
    _SWEPT,
    BOOT_PRELUDE,
    CGROUP_MOUNT,
    LABEL,
    RUN_MOUNT,
    Container,
    ContainerConfinement,
    container_init,
    detect_engine,
    engine_caps,
    find_engine,
    has_image,
    missing_image,
    owner_of,
    pause_process,
    remove_abandoned_containers,
    scratch_mounts,
)
from tracegym.runtimes.container_image import (
    BUILD_HINT,
    DEFAULT_MIRROR,
    IMAGE,
    BuiltImage,
    build_image,
    host_mirror,
    image_present,
    mirror_in,
)
from tracegym.runtimes.process_sandbox import MARKER, Launch, ProcessSandbox
from tracegym.runtimes.sandbox import Forward, Limits, RuntimeUnavailable
from tracegym.runtimes.workdir import make_workdir, read_file, remove_workdir, write_file
from tracegym.testing import ScriptedModel

NO_DAEMON = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


def fake_engine(folder: Path, name: str, says: str = "", status: int = 0) -> None:
    """A client called `name` whose `info` prints `says` on stderr and exits `status`."""
    script = folder / name
    script.write_text(f"#!/bin/sh\necho '{says}' >&2\nexit {status}\n")
    script.chmod(0o755)


# --- which engine ---------------------------------------------------------------------------------------------
def test_a_podman_that_answers_info_is_the_engine(tmp_path: Path) -> None:
    fake_engine(tmp_path, "podman")
    assert find_engine(str(tmp_path)) == (str(tmp_path / "podman"), "")


def test_a_docker_client_without_its_daemon_is_no_engine_and_says_why(tmp_path: Path) -> None:
    fake_engine(tmp_path, "docker", NO_DAEMON, 1)
    engine, why = find_engine(str(tmp_path))
    assert engine is None
    assert why == f"podman is not installed; docker is installed but does not answer ({NO_DAEMON}; info exit status 1)"


def test_docker_is_the_engine_when_podman_does_not_answer(tmp_path: Path) -> None:
    fake_engine(tmp_path, "podman", "Error: cannot set up namespace", 125)
    fake_engine(tmp_path, "docker")
    assert find_engine(str(tmp_path)) == (str(tmp_path / "docker"), "")


def test_podman_comes_first_when_both_answer(tmp_path: Path) -> None:
    fake_engine(tmp_path, "docker")
    fake_engine(tmp_path, "podman")
    assert find_engine(str(tmp_path))[0] == str(tmp_path / "podman")


DOCKER_CLI = """#!/bin/sh
# answers as docker's CLI (24.0) does, its daemon up; an empty image store; each call logged
echo "$@" >> "$0.log"
case "$1" in
info) printf 'Client: Docker Engine - Community\n Version:    24.0.7\n Context:    default\n\nServer:\n'
      printf ' Containers: 0\n Server Version: 24.0.7\n Storage Driver: overlay2\n Cgroup Driver: cgroupfs\n'
      printf ' Cgroup Version: 1\n Security Options:\n  seccomp\n'; exit 0;;
image) [ "$2" = inspect ] && { echo '[]'; echo "Error: No such image: $3" >&2; exit 1; };;
esac
echo "docker: '$1' is not a docker command." >&2; exit 1
"""


def test_a_docker_cli_whose_daemon_answers_is_the_engine_where_no_podman_is(tmp_path: Path) -> None:
    """A fake `docker` on PATH answering as docker's CLI does (no daemon runs here): found by `info` alone,
    its store asked for the image (`image inspect`), never pulled from, and the hint names docker."""
    docker = tmp_path / "docker"
    docker.write_text(DOCKER_CLI)
    docker.chmod(0o755)
    assert find_engine(str(tmp_path)) == (str(docker), "")
    assert not has_image(str(docker), IMAGE)
    assert (tmp_path / "docker.log").read_text().splitlines() == ["info", f"image inspect {IMAGE}"]
    assert "not in docker's store" in missing_image(str(docker), IMAGE)


def test_a_docker_container_is_run_with_the_engines_caps_and_no_podman_only_step(tmp_path: Path) -> None:
    """Docker's daemon (root's) caps the container; its command line has no podman `init` and no `rm -i`."""
    assert engine_caps("/usr/bin/docker")
    workdir = tmp_path / "sandbox" / "work"
    workdir.mkdir(parents=True)
    confinement = ContainerConfinement("/usr/bin/docker", IMAGE)
    command = confinement.wrap(launch_in(workdir, 1, Limits(memory_mb=300)))
    confinement._close_run("abc/1/")
    assert command[:2] == ["/usr/bin/docker", "run"] and "--memory" in command and "--pids-limit" in command


def test_a_rootless_podman_without_the_memory_and_pids_controllers_does_not_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rootless podman on cgroup v1 lists no controllers (it would ignore --memory and warn on the run's stderr);
    on cgroup v2 with them delegated it caps."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for folder, controllers, caps in (("v1", "[]", False), ("v2", '["cpu","memory","pids"]', True)):
        (tmp_path / folder).mkdir()
        script = tmp_path / folder / "podman"
        script.write_text(f"#!/bin/sh\necho '{controllers}'\n")
        script.chmod(0o755)
        assert engine_caps(str(script)) is caps, folder


def test_where_the_engine_cannot_cap_the_sandboxs_cgroup_entries_are_bound_for_the_init(tmp_path: Path) -> None:
    """No --memory or --pids-limit; each entry file of the sandbox's cgroup bound alone, and the init told their
    paths inside in place of descriptors."""
    workdir = tmp_path / "sandbox" / "work"
    workdir.mkdir(parents=True)
    entries = (Path("/sys/fs/cgroup/memory/u/tg-1/cgroup.procs"), Path("/sys/fs/cgroup/pids/u/tg-1/cgroup.procs"))
    launch = launch_in(workdir, 1)
    launch = Launch(launch.argv, launch.init, workdir, launch.limits, launch.env, launch.marker, None, cgroup=entries)
    confinement = ContainerConfinement("/usr/bin/podman", IMAGE, caps=False)
    command = confinement.wrap(launch)
    confinement._close_run("abc/1/")
    assert "--memory" not in command and "--pids-limit" not in command
    assert f"{entries[0]}:{CGROUP_MOUNT}/0" in command and f"{entries[1]}:{CGROUP_MOUNT}/1" in command
    assert command[command.index(IMAGE) + 1:][10] == f"{CGROUP_MOUNT}/0,{CGROUP_MOUNT}/1"


def test_a_rootless_podmans_pause_process_is_found_from_its_run_root(tmp_path: Path) -> None:
    """Its pid file is `libpod/tmp/pause.pid` beside the run root `podman info` names."""
    (tmp_path / "run" / "libpod" / "tmp").mkdir(parents=True)
    (tmp_path / "run" / "libpod" / "tmp" / "pause.pid").write_text(str(os.getpid()))
    script = tmp_path / "podman"
    script.write_text(f"#!/bin/sh\necho {tmp_path / 'run' / 'containers'}\n")
    script.chmod(0o755)
    assert pause_process(str(script)) == os.getpid()


@pytest.fixture
def holder() -> Iterator[int]:
    """A process holding a user and mount namespace of its own, as a rootless podman's pause process does."""
    proc = subprocess.Popen(["unshare", "--user", "--map-root-user", "--mount", "cat"], stdin=subprocess.PIPE)
    try:
        assert wait_until(lambda: os.readlink(f"/proc/{proc.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"), 30)
        yield proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()


def test_a_rootless_engines_sandbox_folder_is_one_tmpfs_in_its_pause_process_namespaces(
        holder: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mounted where the engine makes its containers' mounts, reached by the host through the holder's root, the
    scratch folders bound from it (one cap), and unmounted there at removal."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    workdir, capped = make_workdir(f"{os.getpid()}-holder-test", None, 4, holder=holder)
    try:
        assert capped and workdir.is_symlink()
        assert f"tracegym-sandbox {workdir.parent} tmpfs" in Path(f"/proc/{holder}/mounts").read_text()
        write_file(workdir, "sub/a.txt", "from the host")
        assert read_file(workdir, "sub/a.txt") == b"from the host"
        with pytest.raises(OSError, match="No space left"):
            (workdir / "fill").write_bytes(b"x" * (5 << 20))
        flags = scratch_mounts(Launch([], [], workdir, Limits(disk_mb=4), {}, "x/1/", None))
        assert "--tmpfs" not in flags and f"{workdir.parent / 'tmp'}:/tmp:nosuid,nodev" in flags
    finally:
        remove_workdir(workdir.parent)
    assert "tracegym-sandbox" not in Path(f"/proc/{holder}/mounts").read_text() and not workdir.parent.exists()


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")
def test_the_installed_podman_is_detected() -> None:
    engine, why = detect_engine()
    assert engine == shutil.which("podman"), why


# --- the image ------------------------------------------------------------------------------------------------
def test_an_image_not_in_the_store_is_refused_never_pulled() -> None:
    said = missing_image("/usr/bin/podman", "python:3.12-slim")
    assert "'python:3.12-slim' is not in podman's store and tracegym never pulls one" in said
    assert "podman pull python:3.12-slim" in said and "Container(image=...)" in said
    assert BUILD_HINT in missing_image("/usr/bin/podman", IMAGE)


@pytest.mark.skipif(detect_engine()[0] is None, reason=detect_engine()[1])
def test_the_runtime_is_unavailable_while_its_image_is_missing_and_nothing_is_pulled() -> None:
    engine = detect_engine()[0]
    assert engine is not None
    runtime = Container(image="docker.io/library/tracegym-no-such-image:none")
    assert runtime.unavailable() == missing_image(engine, runtime.image)
    assert not image_present(engine, runtime.image)


def test_the_mirror_is_the_one_apt_uses_for_the_suite(tmp_path: Path) -> None:
    (tmp_path / "debian.sources").write_text(
        "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\nURIs: http://mirror.example/debian/\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://security.example/debian\n"
        "Suites: bookworm-security\nComponents: main\n")
    (tmp_path / "cloud.list").write_text("deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n")
    assert host_mirror((tmp_path / "sources.list", tmp_path)) == "http://mirror.example/debian"


def test_a_one_line_source_names_the_mirror_and_none_falls_back_to_debians(tmp_path: Path) -> None:
    line = "deb [signed-by=/usr/share/keyrings/debian.gpg] http://ftp.example/debian bookworm main\n"
    assert mirror_in("# deb http://old.example/debian bookworm main\n" + line, deb822=False) == \
        "http://ftp.example/debian"
    assert host_mirror((tmp_path / "absent.list",)) == DEFAULT_MIRROR


@pytest.mark.skipif(os.geteuid() != 0, reason="not root: the build refuses for that first")
def test_a_build_without_debootstrap_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_engine(tmp_path, "podman", status=1)  # its store has no image: `image inspect` fails
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeUnavailable, match="needs debootstrap, which is not installed"):
        build_image(str(tmp_path / "podman"), "tracegym-no-such-image:none", mirror="http://127.0.0.1:9/debian")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debootstrap") is None, reason="needs root and debootstrap")
def test_a_build_without_network_to_the_mirror_names_the_mirror(tmp_path: Path) -> None:
    fake_engine(tmp_path, "podman", status=1)  # its store has no image: `image inspect` fails
    with pytest.raises(RuntimeUnavailable) as raised:
        build_image(str(tmp_path / "podman"), "tracegym-no-such-image:none", mirror="http://127.0.0.1:9/debian")
    assert "needs network to the Debian mirror http://127.0.0.1:9/debian, which did not answer" in str(raised.value)


# --- the command line -----------------------------------------------------------------------------------------
def test_a_run_is_the_engine_running_the_program_init_confined(tmp_path: Path) -> None:
    """Unit level: the flags, the init's channels as files of the run's own folder, and the environment in a file
    of that folder, never on the command line or in the client's environment."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    run = tmp_path.with_name(f"{tmp_path.name}-run-3")  # beside the sandbox's folder, named after it
    confinement = ContainerConfinement("/usr/bin/podman", IMAGE)
    limits = Limits(memory_mb=300, processes=20, open_files=50, disk_mb=64)
    env = {"PATH": "/usr/bin", "HOME": str(workdir), "OPENAI_API_KEY": "key-s3cret", MARKER: "abc/3/"}
    init = ["/usr/bin/python3", "-I", "-S", "-c", "SOURCE", "12", "15", "1234567", str(workdir), "-", "1", "2", "3",
            "4", "5", "--", "python3", "x.py"]
    command = confinement.wrap(Launch(["python3", "x.py"], init, workdir, limits, env, "abc/3/", 1234567,
                                      Forward(8080, Path("/tmp/proxy-folder/proxy.sock"))))
    flags = " ".join(command)
    for flag in ("run -i --pull never", "--network none", "--memory 300m --memory-swap 300m", "--pids-limit 52",
                 "--cap-drop ALL --cap-add SETUID --cap-add SETGID", "--security-opt no-new-privileges",
                 "--read-only", "--tmpfs /tmp:size=64m", f"-v {workdir}:{workdir}", f"-v {run}:{RUN_MOUNT}",
                 "-v /tmp/proxy-folder:/tmp/proxy-folder:ro", "--name tracegym-abc-3", f"--label {LABEL}=abc"):
        assert flag in flags, flag
    assert command[command.index(IMAGE) + 1:] == container_init(init)
    assert container_init(init)[5:7] == [f"{RUN_MOUNT}/status", f"{RUN_MOUNT}/lifeline"]
    assert "s3cret" not in flags and "-e" not in command
    assert (run / "environ").read_bytes().split(b"\0")[2] == b"OPENAI_API_KEY=key-s3cret"
    client = confinement.spawn_env(env)
    assert client[MARKER] == "abc/3/" and client.get("HOME") != str(workdir) and "OPENAI_API_KEY" not in client
    assert "could not run the container" in confinement.exit_status(125, "abc/3/")["start_error"]  # type: ignore
    assert not run.exists()  # the run's folder goes with its end


def launch_in(workdir: Path, run: int, limits: Limits | None = None) -> Launch:
    """Run `run` of sandbox `abc` in `workdir` (its init's command line as process_sandbox makes it)."""
    init = ["/usr/bin/python3", "-I", "-S", "-c", "SOURCE", "12", "15", "-", str(workdir), "-", "-", "0", "0", "0",
            "0", "0", "--", "echo", "a b", ""]
    return Launch(init[-3:], init, workdir, limits or Limits(), {"PATH": "/usr/bin", MARKER: f"abc/{run}/"},
                  f"abc/{run}/", None)


async def test_from_the_second_run_on_the_next_runs_container_is_created_ahead_and_started(tmp_path: Path) -> None:
    """Run 2 starts creating run 3's container (the fake engine's `create`, done at once); run 3 starts that one,
    with its init's source and arguments in its run folder; a container created ahead and never used is
    removed at the close."""
    fake_engine(tmp_path, "podman")
    workdir = tmp_path / "sandbox" / "work"
    workdir.mkdir(parents=True)
    confinement = ContainerConfinement(str(tmp_path / "podman"), IMAGE)
    assert confinement.wrap(launch_in(workdir, 1))[1] == "run"
    assert confinement.wrap(launch_in(workdir, 2))[1] == "run"
    prepared = confinement._prepared
    assert prepared is not None and prepared.name == "tracegym-abc-p2"
    prepared.creating.wait()
    assert confinement.wrap(launch_in(workdir, 3))[1:] == ["start", "-a", "-i", "tracegym-abc-p2"]
    argv = (prepared.files.folder / "argv").read_bytes().split(b"\0")
    assert argv == [b"SOURCE", f"{RUN_MOUNT}/status".encode(), f"{RUN_MOUNT}/lifeline".encode(), b"-",
                    str(workdir).encode(), b"-", b"-", b"0", b"0", b"0", b"0", b"0", b"--", b"echo", b"a b", b""]
    ahead = confinement._prepared
    assert ahead is not None and ahead.name == "tracegym-abc-p3"
    ahead.creating.wait()
    await confinement.release("abc")
    assert not ahead.files.folder.exists()
    assert confinement._prepared is None and confinement._started == []


def test_a_container_created_ahead_with_other_limits_is_not_used(tmp_path: Path) -> None:
    fake_engine(tmp_path, "podman")
    workdir = tmp_path / "sandbox" / "work"
    workdir.mkdir(parents=True)
    confinement = ContainerConfinement(str(tmp_path / "podman"), IMAGE)
    for run in (1, 2):
        confinement.wrap(launch_in(workdir, run))
    prepared = confinement._prepared
    assert prepared is not None
    prepared.creating.wait()
    command = confinement.wrap(launch_in(workdir, 3, Limits(memory_mb=300)))
    assert command[1] == "run" and "--memory" in command
    assert prepared.name in confinement._started and not prepared.files.folder.exists()  # removed at the close


def test_a_container_created_ahead_runs_the_init_with_the_runs_arguments_and_environment(tmp_path: Path) -> None:
    """The prelude of a container created ahead (its run folder here in place of RUN_MOUNT) gives the init the
    environment and sys.argv it would have had on the command line."""
    (tmp_path / "environ").write_bytes(b"PATH=/usr/bin\0LINE=a\nb\0")
    (tmp_path / "argv").write_bytes(b"\0".join([b"import os, sys\nprint(sys.argv, dict(os.environ))", b"x y", b""]))
    done = subprocess.run([sys.executable, "-I", "-S", "-c", BOOT_PRELUDE.replace(RUN_MOUNT, str(tmp_path))],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(["-c", "x y", ""]) + " " + str({"PATH": "/usr/bin", "LINE": "a\nb"})


@pytest.mark.skipif(os.geteuid() != 0, reason="only root mounts the sandbox folder's tmpfs")
def test_a_capped_sandbox_folder_lends_its_subfolders_as_the_containers_scratch_folders() -> None:
    """Where the sandbox's folder is one tmpfs of disk_mb, /tmp, /var/tmp, /dev/shm and home are its subfolders
    bound in (one cap with the working directory), not tmpfs of their own."""
    workdir, capped = make_workdir("test-scratch", None, 16)
    try:
        flags = scratch_mounts(Launch([], [], workdir, Limits(disk_mb=16), {}, "x/1/", None))
    finally:
        remove_workdir(workdir.parent)
    assert capped
    assert "--tmpfs" not in flags and "--shm-size" not in flags and flags[:2] == ["--ipc", "private"]
    mounts = [flags[i + 1] for i, flag in enumerate(flags) if flag == "-v"]
    for inside, name in (("/tmp", "tmp"), ("/var/tmp", "var-tmp"), ("/dev/shm", "shm")):
        assert f"{workdir.parent / name}:{inside}:nosuid,nodev" in mounts


# --- real containers (slow) -----------------------------------------------------------------------------------
@pytest.fixture
async def box(container_image: BuiltImage) -> AsyncIterator[ProcessSandbox]:
    sandbox = await Container(Limits(wall_seconds=20, memory_mb=256, processes=32, disk_mb=16)).open()
    yield sandbox
    await sandbox.close()


@pytest.mark.slow
def test_a_second_build_finds_the_image_at_once(container_image: BuiltImage) -> None:
    again = build_image(container_image.engine)
    assert again.build_s == 0 and again.size_bytes == container_image.size_bytes > 0


@pytest.mark.slow
async def test_a_program_in_a_container_has_no_capabilities_network_or_writable_root(box: ProcessSandbox) -> None:
    probe = ("import os\nstatus = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines()"
             " if ':\\t' in line)\nprint(os.getuid(), status['CapEff'].strip(), status['NoNewPrivs'].strip())\n"
             "print(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]))\n"
             f"for path in ('/usr/planted', '{RUN_MOUNT}/status'):\n    try:\n        open(path, 'w')\n"
             "        print('wrote', path)\n    except OSError as exc:\n        print('refused', exc.errno)\n")
    result = await box.run(["python3", "-c", probe])
    assert result.ok, result
    ids, interfaces, usr, run_folder = result.stdout.splitlines()
    assert ids == f"{box.uid} 0000000000000000 1"
    assert interfaces == "['lo']"
    assert (usr, run_folder) == ("refused 30", "refused 13")  # read-only root; the init's folder is root's


@pytest.mark.slow
async def test_the_memory_cap_holds_the_whole_run_not_each_process(box: ProcessSandbox) -> None:
    """Six children of 100 MB each (each under the per-process limit of 256 MB): the run's memory cgroup holds
    256 MB in all, so they cannot all hold theirs at once."""
    program = ("import os, time\nfor _ in range(6):\n    if os.fork() == 0:\n        block = bytearray(100 << 20)\n"
               "        print('held', flush=True)\n        time.sleep(2)\n        os._exit(0)\n"
               "while True:\n    try:\n        os.wait()\n    except ChildProcessError:\n        break\n")
    result = await box.run(["python3", "-c", program])
    assert result.stdout.count("held") < 6, result


@pytest.mark.slow
async def test_no_container_of_a_sandbox_is_left_after_a_cancel_and_its_close(box: ProcessSandbox) -> None:
    run = asyncio.ensure_future(box.run(["sleep", "30"]))
    listed = ["podman", "ps", "-aq", "--filter", f"label={LABEL}={box.id}"]
    while not subprocess.run(listed, capture_output=True, text=True).stdout.strip():
        await asyncio.sleep(0.05)  # until the engine lists it
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await box.close()
    assert subprocess.run(listed, capture_output=True, text=True).stdout.strip() == ""
    assert box.sweep() == []


@pytest.mark.slow
async def test_a_run_in_a_container_created_ahead_gets_its_arguments_environment_and_stdin(box: ProcessSandbox) -> None:
    """The third run of a sandbox starts the container created ahead during the second (waited for here, so the
    run takes it), with the run's own arguments, environment and stdin; nothing of the sandbox is left after."""
    for _ in range(2):
        assert (await box.run(["true"])).ok
    confinement = box.confinement
    assert isinstance(confinement, ContainerConfinement) and confinement._prepared is not None
    await asyncio.to_thread(confinement._prepared.creating.wait)
    probe = "import os, sys\nprint(sys.argv[1:], os.environ['WORD'], sys.stdin.read())"
    result = await box.run(["python3", "-c", probe, "a b", ""], env={"WORD": "x\ny"}, stdin=b"fed")
    assert result.ok, result
    assert result.stdout == "['a b', ''] x\ny fed\n"
    assert list(confinement._names.values())[-1].endswith("-p2")
    await box.close()
    listed = ["podman", "ps", "-aq", "--filter", f"label={LABEL}={box.id}"]
    assert subprocess.run(listed, capture_output=True, text=True).stdout.strip() == ""


ASK = """
import json, os, socket, urllib.request
try:
    socket.create_connection(('127.0.0.1', int(os.environ['CANARY'])), timeout=2)
    print('canary reached')
except OSError as exc:
    print('canary refused', exc)
body = json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": json.loads(os.environ["TRACEGYM_MESSAGES"])})
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request, timeout=30))["choices"][0]["message"]["content"]
open("out.txt", "w").write(reply)
print("said", reply)
"""


class InContainer(Task):
    """An agent program's rollout in the container runtime; rewarded for the model's reply in its file."""

    def runtime(self) -> Container:
        return Container(Limits(wall_seconds=30))

    @reward
    def wrote_it(self, trace: object) -> float:
        return float(self.program.file("out.txt") == "hello" and "said hello" in self.program.result.stdout)


@pytest.mark.slow
async def test_an_agent_program_in_a_container_reaches_the_proxy_and_nothing_else(
        container_image: BuiltImage) -> None:
    """A ProgramHarness program under the container runtime (no network): its model call goes through the init's
    forwarded port to the proxy and lands on the trace; a canary on the host's loopback is out of reach."""
    hits: list[bytes] = []

    async def canary(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(canary, "127.0.0.1", 0)
    task = InContainer(TaskData(prompt="say hello", system_prompt="be brief"))
    code = ASK.replace("{", "{{").replace("}", "}}")  # the command is a template
    task.harness = ProgramHarness(["python3", "-c", code], env={"CANARY": str(server.sockets[0].getsockname()[1])},
                                  limits=Limits(wall_seconds=30))
    async with server:
        trace = await rollout(task, ScriptedModel(["hello"], tokens=True), Sampling(max_tokens=8))
    assert not trace.errors and trace.stop_reason == StopReason.COMPLETED, trace.errors
    assert trace.reward == 1.0 and task.program.calls == 1
    assert "canary refused" in task.program.result.stdout and hits == []
    assert trace.graph.nodes[-1].token_ids  # the exact tokens, as from any runtime


def test_a_container_is_known_by_its_owner_process_from_its_name() -> None:
    assert owner_of("tracegym-4242-0a1b2c3d4e5f-7") == 4242
    assert owner_of("tracegym-sandbox-x") == owner_of("someone-else-1") == 0


@pytest.mark.slow
async def test_the_containers_of_a_killed_host_are_removed_by_the_next_process(container_image: BuiltImage,
                                                                                tmp_path: Path) -> None:
    """A host process dies by SIGKILL mid-run: its container ends (the lifeline), and the next process's first
    sandbox removes what the engine kept of it."""
    script = tmp_path / "host.py"
    script.write_text("import asyncio\nfrom tracegym.runtimes.container import Container\nasync def main():\n"
                      "    box = await Container().open()\n    print(box.id, flush=True)\n"
                      "    await box.run(['sleep', '60'])\nasyncio.run(main())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    host = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env, text=True)
    engine = container_image.engine
    try:
        assert host.stdout is not None
        name = f"tracegym-{host.stdout.readline().strip()}-1"
        state = [engine, "container", "inspect", "--format", "{{.State.Status}}", name]
        assert wait_until(lambda: "running" in subprocess.run(state, capture_output=True, text=True).stdout.lower())
    finally:
        host.kill()
        host.wait()
    assert wait_until(lambda: "exited" in subprocess.run(state, capture_output=True, text=True).stdout.lower())
    _SWEPT.discard(engine)
    assert name in await remove_abandoned_containers(engine)
    assert subprocess.run(state, capture_output=True, text=True).stdout.strip() == ""
