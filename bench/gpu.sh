#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script for a lent device machine (under 8 minutes):
# the CUDA tests (varlen flash attention in the engine) and bench/gpu_embed.py on the GPU.
#   bash bench/gpu.sh            # from the repository root, on the GPU machine
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-gpu
.venv-gpu/bin/pip install -q --upgrade pip
.venv-gpu/bin/pip install -q torch==2.13.0 || .venv-gpu/bin/pip install -q torch
.venv-gpu/bin/pip install -q -e '.[test]'
.venv-gpu/bin/python -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
.venv-gpu/bin/python -m pytest tests/test_inference.py tests/test_model.py -q -k "cuda or packed" -rs
mkdir -p "${OUT:-/tmp}/bench"
timeout 420 .venv-gpu/bin/python bench/gpu_embed.py --device cuda --sentences 10000 \
    | tee "${OUT:-/tmp}/bench/gpu_embed.txt" || echo "bench/gpu_embed.py on cuda did not finish"
