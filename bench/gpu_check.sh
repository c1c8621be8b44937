#!/usr/bin/env bash
# The checks only a GPU machine can run, in one go (about 8 minutes on an H100, plus up to 10 minutes for
# each of step 4's two benches: select steps with ONLY=...; the scaling bench can run beside the others,
# pinned to other cores, as on 2026-11-30):
#   1. the Triton kernels compiled for the GPU against the core (tests/kernels), and the env on real
#      CUDA streams and CUDA AMP (tests/shell/env/test_env_cuda.py); CI has no GPU, so these skip there;
#   2. bench rows that need a GPU: GAE with the fused kernel, the 8-head loss with the fused
#      masked-categorical kernel (bench.run --suite gae, then --suite loss, --device cuda);
#   3. the CLI end to end on CUDA, alone and under torchrun (NCCL, one rank), and with ppo.replay,
#      then resumed from its checkpoint for two more updates;
#   4. (issue 44) episodes per second of the default preset on the GPU, batched against one CUDA stream
#      per env and against the CPU, at 8, 32 and 128 envs (bench.throughput), and torchrun scaling on
#      the machine's CPU cores at 1, 2, 4 and 8 processes (bench.scaling).
#   5. (issue 44) one epoch of the batched hosts with its training step captured as a CUDA graph against
#      eager, at 8, 32 and 128 envs (bench.run --suite hosts_cuda_graph; ONLY=cuda-graph runs it alone).
# Usage, from the repository root: bash bench/gpu_check.sh [OUT_DIR]   (default: bench/results/gpu)
# ONLY="tests bench-gae" runs some steps; TESTS="path ..." replaces the test selection.
# Packages the machine lacks can sit as wheels in .whl/ (installed to /tmp/site, nothing else touched).
set -u
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
OUT_DIR=${1:-bench/results/gpu}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu-check.log"
: >"$LOG"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl 2>&1 | tail -3 | tee -a "$LOG"
    export PYTHONPATH=/tmp/site
    if ! python3 -c "import tensordict, torchrl" >>"$LOG" 2>&1 && compgen -G ".whl/alt/*.whl" >/dev/null; then
        echo "tensordict/torchrl from .whl do not import with this torch: trying .whl/alt" | tee -a "$LOG"
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/alt/*.whl 2>&1 | tail -3 | tee -a "$LOG"
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log it, never stop the script
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    echo "=== $name: $*" | tee -a "$LOG"
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    echo "=== $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$LOG"
}

step versions 60 bash -c 'nvidia-smi -L; python3 -c "
import torch, triton, tensordict, torchrl
print(\"torch\", torch.__version__, \"triton\", triton.__version__, \"tensordict\", tensordict.__version__,
      \"torchrl\", torchrl.__version__, torch.cuda.get_device_name())"'
step tests 240 python3 -m pytest -q -p no:cacheprovider -o addopts="-ra --durations=5" \
    ${TESTS:-tests/kernels tests/shell/env/test_env_cuda.py tests/shell/agent/test_trainer_cuda.py}
step bench-gae 230 python3 -m bench.run --suite gae --device cuda --out "$OUT_DIR" --tag gpu-kernels-gae
step bench-loss 300 python3 -m bench.run --suite loss --quick --device cuda --out "$OUT_DIR" --tag gpu-kernels-loss
step run-cuda 60 python3 -m esper.shell.run --preset smoke --env.device cuda --run_dir /tmp/esper-gpu-run
step run-replay 240 bash -c 'python3 -m esper.shell.run --preset smoke --env.device cuda --ppo.replay 2 \
    --updates 3 --run_dir /tmp --name esper-gpu-replay && python3 -m esper.shell.run \
    --resume /tmp/esper-gpu-replay --updates 5 && python3 -c "
import json; ev = [json.loads(l) for l in open(\"/tmp/esper-gpu-replay/events.jsonl\")]
up = [e for e in ev if e.get(\"event\") == \"ppo_update\"]
print(\"updates\", len(up), \"replayed_envs\", [e.get(\"replayed_envs\") for e in up])"'
# a cell is start-up, a warm-up update and a timed one: 70-135 s batched on an H200 (2026-11-30)
step throughput 600 python3 -m bench.throughput --envs 8 32 128 --cell-timeout 200 \
    --deadline "${THROUGHPUT_DEADLINE:-560}" --paths cuda:batched cuda:per_env cpu:batched:2 --out "$OUT_DIR"
step scaling 420 python3 -m bench.scaling --ranks 1 2 4 8 --cores 8 --updates 2 --repeats 1 --out "$OUT_DIR"
step cuda-graph 300 python3 -m bench.run --suite hosts_cuda_graph --device cuda --out "$OUT_DIR" \
    --tag hosts-cuda-graph
step torchrun-nccl 60 torchrun --standalone --nproc_per_node=1 -m esper.shell.run --preset smoke \
    --env.device cuda --run_dir /tmp/esper-gpu-torchrun
grep "^=== .*rc=" "$LOG"
