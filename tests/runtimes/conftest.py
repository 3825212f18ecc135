"""The container runtime's image, built once per test session (from Debian packages; reused when the engine's
store has it) for every test that runs a container."""

from __future__ import annotations

import os
import shutil

import pytest

from tracegym.runtimes.container import Container, detect_engine
from tracegym.runtimes.container_image import BuiltImage, build_image


@pytest.fixture(scope="session")
def container_image() -> BuiltImage:
    """The default image in the detected engine's store: built the first time (about a minute), else found at
    once. Skipped where it cannot be built here (no engine, not root, no debootstrap); a build that fails anyway
    (the mirror unreachable) fails the test that needed it."""
    engine, why = detect_engine()
    if engine is None:
        pytest.skip(why)
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        pytest.skip("building the container image needs root and debootstrap (apt-get install debootstrap)")
    return build_image(engine)


@pytest.fixture(autouse=True)
def _container_image_for_containers(request: pytest.FixtureRequest) -> None:
    """A test run with a Container among its parameters gets the image first."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and any(isinstance(value, Container) for value in callspec.params.values()):
        request.getfixturevalue("container_image")
