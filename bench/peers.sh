#!/usr/bin/env bash
# Creates the venvs that bench/infer.py runs its peers in; idempotent (a venv whose stamp matches
# the pins is left alone; changed pins reinstall it).
#   .venv-bench-st   the `bench` extra: sentence-transformers (torch backend, CrossEncoder) and
#                    transformers, the newest releases
#   .venv-bench-ort  the `bench-ort` extra: ONNX Runtime through optimum, and sentence-transformers'
#                    own ONNX backend (it needs optimum, which caps it at an older release)
#   .venv-bench-ct2  the `bench-ct2` extra: CTranslate2 (its Encoder) and the transformers its
#                    converter (`ct2-transformers-converter`) reads the model with
#   .venv-bench-ov   the `bench-ov` extra: OpenVINO through sentence-transformers' backend="openvino"
#                    (optimum-intel) and NNCF, which quantizes for it
# The pins live in pyproject.toml's extras; this script reads them from there. Separate venvs because
# optimum[onnxruntime] downgrades sentence-transformers and transformers, and each peer stack pins
# its own transformers. Peers are never runtime
# dependencies: bertkit itself is not installed in these venvs, nor the peers in .venv.
# torch goes in FIRST and exactly pinned: the pin selects the CPU wheel; a looser spec lets a later
# install pull a multi-GB CUDA build.
#
#   bash bench/peers.sh            # all four; PYTHON=python3.11 bash bench/peers.sh to choose the interpreter
#   bash bench/peers.sh ct2 ov     # only the venvs named (st, ort, ct2, ov)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH="torch==2.13.0"

extra() {  # extra NAME: the extra's requirements from pyproject.toml, one a line
    "$PYTHON" - "$1" <<'PY'
import sys, tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
if sys.argv[1] not in extras:
    sys.exit(f"pyproject.toml has no extra {sys.argv[1]!r}; known: {', '.join(extras)}")
print("\n".join(extras[sys.argv[1]]))
PY
}

make_venv() {  # make_venv DIR EXTRA
    local dir=$1 pins
    mapfile -t pins < <(extra "$2")
    local want="$TORCH ${pins[*]}"
    if [[ -f "$dir/.bench-stamp" && "$(cat "$dir/.bench-stamp")" == "$want" ]]; then
        echo "$dir: up to date ($want)"; return
    fi
    test -x "$dir/bin/python" || "$PYTHON" -m venv "$dir"
    echo "*" > "$dir/.gitignore"  # keeps the venv out of git status without editing .gitignore
    "$dir/bin/pip" install -q --upgrade pip
    "$dir/bin/pip" install -q "$TORCH"
    # torch repeated so that the resolver keeps the CPU wheel already there.
    "$dir/bin/pip" install -q "$TORCH" "${pins[@]}"
    if [[ "$2" == bench-ov ]]; then
        # optimum-intel pulls torchvision, whose PyPI wheel is built for CUDA torch: against the CPU
        # torch its ops fail to register and `import transformers` breaks. Nothing benched here
        # uses it (text models only), so it goes.
        "$dir/bin/pip" uninstall -q -y torchvision
    fi
    echo "$want" > "$dir/.bench-stamp.tmp" && mv "$dir/.bench-stamp.tmp" "$dir/.bench-stamp"
    echo "$dir: installed"
    "$dir/bin/pip" freeze | grep -iE '^(torch|transformers|sentence-transformers|optimum|onnx|numpy|ctranslate2|openvino|nncf)' || true
}

declare -A EXTRAS=([st]=bench [ort]=bench-ort [ct2]=bench-ct2 [ov]=bench-ov)
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(st ort ct2 ov)
for name in "${names[@]}"; do
    [[ -n "${EXTRAS[$name]:-}" ]] || { echo "unknown peer venv '$name'; choose from: ${!EXTRAS[*]}" >&2; exit 2; }
done
for name in "${names[@]}"; do
    make_venv ".venv-bench-$name" "${EXTRAS[$name]}"
done
