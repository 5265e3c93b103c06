#!/usr/bin/env bash
# Everything GPU-related in one go, on a machine with an NVIDIA GPU and CUDA 12 drivers, within
# ten minutes: a fresh virtual environment with the repository's packages, onemodel-cupy with
# cupy-cuda12x and (if it installs) onnxruntime-gpu; the cupy plugin's tests on the "cuda"
# device; and the latency table of plugins/cupy/benchmarks/gpu_latency.py.
#
#   bash scripts/gpu_check.sh                 # venv in $TMPDIR/onemodel-gpu-venv (reused)
#   GPU_VENV=/tmp/v bash scripts/gpu_check.sh
#   GPU_CHECK_ZOO=squeezenet,resnet50 bash scripts/gpu_check.sh   # fewer zoo networks
#   GPU_CHECK_OFFLINE=wheels/ PYTHON=/opt/py/bin/python3 bash scripts/gpu_check.sh
#
# GPU_CHECK_OFFLINE is for a machine with no package index: PYTHON must already have CuPy,
# numpy, numba, onnx, pluggy, pytest and the packages' other needs; the repository's packages are
# installed into it with --no-deps, their build backend (hatchling and what it needs) taken from
# the wheels in the folder named, and onnxruntime is used as it is.
#
# Exit status: 0 when the GPU tests passed and the benchmark ran; 1 otherwise; 2 when no GPU.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GPU_VENV:-${TMPDIR:-/tmp}/onemodel-gpu-venv}"
PY="${PYTHON:-python3}"
ZOO="${GPU_CHECK_ZOO:-all}"
START=$SECONDS
DEADLINE=$((START + ${GPU_CHECK_SECONDS:-570}))  # the whole check ends within ten minutes
status=0

# seconds a step may take: its own cap, or what is left before the deadline if that is less
cap() { local left=$((DEADLINE - SECONDS)); [ "$left" -lt "$1" ] && echo $((left > 10 ? left : 10)) || echo "$1"; }

step() { printf '\n== %s (%ds elapsed)\n' "$1" "$((SECONDS - START))"; }

step "GPU"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
    echo "no NVIDIA GPU found (nvidia-smi missing or failing): nothing to check here" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

PACKAGES=(-e "$ROOT/packages/tensors" -e "$ROOT/packages/training" -e "$ROOT/packages/runtime"
          -e "$ROOT/packages/tracing" -e "$ROOT/plugins/native" -e "$ROOT/plugins/onnx"
          -e "$ROOT/plugins/numba")
# pip into $VPY (set below) within the step's cap
pip_install() { local t=$1; shift; timeout "$(cap "$t")" "$VPY" -m pip install -q --disable-pip-version-check "$@"; }
OFFLINE="${GPU_CHECK_OFFLINE:-}"
[ -n "$OFFLINE" ] && OFFLINE="$(cd "$OFFLINE" && pwd)"  # pip builds in another folder
if [ -n "$OFFLINE" ]; then
    step "offline: installing into $PY (build backend from $OFFLINE)"
    VPY="$PY"
    if ! "$VPY" -c "import cupy, numba, onnx, pytest" 2>/dev/null; then
        echo "offline mode needs CuPy, numba, onnx and pytest already in $PY" >&2
        exit 1
    fi
    if ! pip_install 300 --no-index --no-deps --find-links "$OFFLINE" \
            "${PACKAGES[@]}" -e "$ROOT/plugins/cupy"; then
        echo "installing the repository's packages offline failed (see above)" >&2
        exit 1
    fi
    ORT=yes  # the benchmark drops onnxruntime's columns by itself when it is not installed
else
    step "virtual environment $VENV"
    if [ ! -x "$VENV/bin/python" ]; then
        "$PY" -m venv "$VENV" || { echo "cannot create $VENV" >&2; exit 1; }
    fi
    VPY="$VENV/bin/python"
    pip_install 60 --upgrade pip >/dev/null 2>&1 || true
    # the repository's packages (editable), the cupy plugin with its CUDA 12 CuPy, the ONNX plugin
    # and onnx (model zoo), numba (its elementwise-fusion pass makes the FusedElementwise nodes
    # the GPU then runs), and the test tools
    if ! pip_install 300 "${PACKAGES[@]}" -e "$ROOT/plugins/cupy[cuda12]" pytest; then
        echo "installing the packages and cupy-cuda12x failed (see above)" >&2
        exit 1
    fi
    # onnxruntime-gpu is optional: its own CUDA/cuDNN needs may not match this machine
    ORT=yes
    if ! pip_install 120 onnxruntime-gpu; then
        echo "onnxruntime-gpu did not install: the table has no onnxruntime-gpu column" >&2
        ORT=no
    fi
fi
"$VPY" - <<'EOF'
import cupy
from onemodel.cupy import device
try:
    print("cupy", cupy.__version__, "| CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
          "| devices", cupy.cuda.runtime.getDeviceCount())
except Exception as exc:
    print("cupy", cupy.__version__, "cannot use the GPU:", exc)
print("onemodel-cupy device usable:", device.available())
try:
    import onnxruntime as ort
    print("onnxruntime", ort.__version__, ort.get_available_providers())
except Exception as exc:
    print("onnxruntime: not importable:", exc)
EOF

step "onemodel-cupy tests on the GPU"
# the "cuda" half of the tests (the host stand-in half runs in the CPU test command)
LIMIT=$(cap 320)  # 149-200+ s on an H200, most of it CuPy compiling its kernels the first time
(cd "$ROOT" && timeout "$LIMIT" "$VPY" -m pytest -q -p no:cacheprovider -rs \
    plugins/cupy/tests/test_devices.py -k cuda)
rc=$?
if [ $rc = 124 ]; then
    echo "GPU tests did not finish within ${LIMIT}s (stopped; raise GPU_CHECK_SECONDS)" >&2
    status=1
elif [ $rc != 0 ]; then
    echo "GPU tests FAILED" >&2
    status=1
fi

step "latency: GPU against CPU"
ORT_FLAG=()
[ "$ORT" = no ] && ORT_FLAG=(--no-ort)
(cd "$ROOT" && timeout "$(cap 240)" "$VPY" plugins/cupy/benchmarks/gpu_latency.py \
    --devices cpu,cuda --zoo "$ZOO" --repeat 5 ${ORT_FLAG[@]+"${ORT_FLAG[@]}"}) || { echo "benchmark FAILED" >&2; status=1; }

step "done: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
