"""Malloc: tcmalloc preloaded into the processes that ask for it, where the machine has it."""

import pytest

from tracegym.train.malloc import malloc_env, preload, tcmalloc_library


def test_the_system_allocator_adds_nothing():
    assert preload("system") == {} and malloc_env("system", {"A": "1"}) == {"A": "1"}


def test_tcmalloc_is_put_first_in_ld_preload_keeping_what_was_there():
    library = tcmalloc_library()
    if library is None:
        pytest.skip("tcmalloc is not installed here (Debian: libtcmalloc-minimal4)")
    assert malloc_env("tcmalloc", {"LD_PRELOAD": "libother.so"})["LD_PRELOAD"] == f"{library}:libother.so"


def test_tcmalloc_already_preloaded_is_not_added_twice():
    assert preload("tcmalloc", "/usr/lib/libtcmalloc.so.4") == {}
