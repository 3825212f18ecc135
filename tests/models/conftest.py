"""Fixtures for model tests: the embedded model's tokenizer and its renderer."""

import pytest

from tracegym.models.renderer import ChatMLRenderer, renderer_for


@pytest.fixture(scope="session")
def smol_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer, from the converted embedded model (converted once per machine)."""
    transformers = pytest.importorskip("transformers")
    from tracegym.models.embedded import embedded_model_dir

    return transformers.AutoTokenizer.from_pretrained(embedded_model_dir())


@pytest.fixture(scope="session")
def smol(smol_tokenizer) -> ChatMLRenderer:
    """Our ChatML renderer for SmolLM2, as `renderer_for` picks it."""
    renderer = renderer_for(smol_tokenizer)
    assert isinstance(renderer, ChatMLRenderer)
    return renderer
