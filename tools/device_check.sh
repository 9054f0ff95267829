#!/usr/bin/env bash
# The accelerator check: one command that measures what only a GPU can tell, writes one JSON summary plus logs.
#
#   bash tools/device_check.sh --out DIR [--cpu] [--parts env,parity,...] [--budget S] [--wheels DIR]
#   bash tools/device_check.sh --fetch-wheels DIR      # here, with the package index: our pure-Python wheels
#
# On a GPU machine with its own JAX (e.g. JAX 0.11.2 with CUDA 13), the project and the wheels in --wheels (default
# .whl) are installed beside that JAX with --no-deps into /tmp/site, never replacing it. Each part has a hard
# time limit and writes its JSON as it goes, so a part that crashes or runs out of time leaves the others' results;
# DIR/summary.json collects them (python -m tools.device_summary). --cpu runs every part with tiny sizes on the CPU
# (the CI test, so the script keeps working between GPU runs). Sized to finish in <= 8 minutes on one H200.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT="" CPU=0 WHEELS=.whl FETCH="" BUDGET="" PARTS="env,parity,mfu,mfu_profile,sampler,job,attention"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --cpu) CPU=1; shift ;;
    --parts) PARTS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --fetch-wheels) FETCH=$2; shift 2 ;;
    *) echo "device_check.sh: unknown argument $1 (see the header of tools/device_check.sh)" >&2; exit 2 ;;
  esac
done

if [ -n "$FETCH" ]; then  # the wheels the GPU image lacks or holds at other versions (Python 3.12, manylinux)
  mkdir -p "$FETCH"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$FETCH" grain==0.2.18 array-record==0.8.6 ml-collections==1.1.0 \
    portpicker flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.8 transformers==5.24.0 tokenizers==0.23.3 \
    huggingface_hub==2.4.0 tensorboard==2.21.0 || exit 1
  python3 -m pip wheel -q --no-deps -w "$FETCH" tfrecord==1.14.6 || exit 1
  ls "$FETCH"
  exit 0
fi
if [ -z "$OUT" ]; then echo "device_check.sh: --out DIR is required" >&2; exit 2; fi
mkdir -p "$OUT" || { echo "device_check.sh: cannot create --out $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 IPL_JAX_PROGRESS_INTERVAL=10
PY=${PYTHON:-python3}
if [ "$CPU" = 1 ] && [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
START=$(date +%s)
if [ -z "$BUDGET" ]; then BUDGET=$([ "$CPU" = 1 ] && echo 3000 || echo 480); fi

# one part: name, time limit (s), command...; its log in $OUT/NAME.log, its status in $OUT/status.jsonl. A part
# never runs past the whole run's budget (--budget, default 480 s on a GPU): its limit is cut to what is left, and
# a part with less than 20 s left is skipped (recorded as such), so the script ends in time with what it measured.
part() {
  local name=$1 limit=$2; shift 2
  case ",$PARTS," in *",$name,"*) ;; *) return 0 ;; esac
  local t0 rc left
  t0=$(date +%s)
  left=$(( BUDGET - (t0 - START) - 5 ))
  if [ "$left" -lt 20 ]; then
    echo "== $name skipped: ${left}s of the budget left"
    echo "{\"part\": \"$name\", \"rc\": null, \"seconds\": 0, \"timed_out\": false, \"skipped\": true}" >> "$OUT/status.jsonl"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  export DEVICE_CHECK_LIMIT=$limit
  echo "== $name (limit ${limit}s, at $((t0 - START))s)"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  tail -n 4 "$OUT/$name.log"
  echo "{\"part\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - t0 )), \"timed_out\": $([ $rc = 124 ] && echo true || echo false)}" >> "$OUT/status.jsonl"
}

if [ "$CPU" = 0 ]; then
  if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
      > "$OUT/install.log" 2>&1 || { echo "wheel install failed: $OUT/install.log"; tail -3 "$OUT/install.log"; }
    export PYTHONPATH=/tmp/site:$REPO${PYTHONPATH:+:$PYTHONPATH}
  else
    export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  fi
  SIZE=2b SMALL=small
else
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  export JAX_PLATFORMS=cpu
  SIZE=tiny SMALL=tiny
fi
: > "$OUT/status.jsonl"

part env 60 $PY -c "
import json, platform, jax, flax, optax
from ipl_jax.model.layers import cudnn_unavailable
d = jax.devices()[0]
info = dict(python=platform.python_version(), jax=jax.__version__, flax=flax.__version__, optax=optax.__version__,
            jax_file=jax.__file__, device=d.device_kind, platform=d.platform, devices=len(jax.devices()),
            cudnn_unavailable=cudnn_unavailable())
print(json.dumps(info)); open('$OUT/env.json', 'w').write(json.dumps(info, indent=1))"

if [ "$CPU" = 0 ]; then
  # in order of importance, so that what the budget cuts is the least needed
  part parity 45 $PY -m tools.gpu_parity --size small --json "$OUT/parity.json"
  # the T-DPO step at the 2B shape with the job's attention ('auto' = cuDNN here) and remat
  part mfu 70 $PY -m tools.gpu_mfu --size 2b --attention auto --remat dots_no_batch --steps 5 --json "$OUT/mfu.json"
  # its profile (one event per kernel: XLA's command buffers off, so timed apart from `mfu`): time per part and
  # phase; `mfu_before` (only when named in --parts) profiles the first-measured configuration
  part mfu_profile 50 $PY -m tools.gpu_mfu --size 2b --attention auto --remat dots_no_batch --steps 1 --skip-matmul \
    --profile /tmp/trace_after --json "$OUT/mfu_profile.json"
  # the tree sampler at 2B with phone screenshots (1,122 image tokens per step): leaves/s, prefill MFU, decode
  # against its bandwidth bound, transformers generate on the same GPU; its own limit writes the partial JSON
  part sampler 90 bash -c '$0 -m tools.bench_sampler_gpu --size 2b --steps 2 --turns 128,64,32,32 \
    --decode-turns 3,1 --decode-options xla_gpu_enable_dynamic_slice_fusion=true \
    --time-limit $((DEVICE_CHECK_LIMIT - 10)) --json "$1"' "$PY" "$OUT/sampler.json"
  # the whole job at 2B: init-model, phone-resolution synthetic AITZ, data -> SFT -> start -> one round -> export
  part job 210 env PYTHON="$PY" bash tools/paper_job.sh --out /tmp/paper_job --json "$OUT/job.json"
  part attention 45 $PY -m tools.bench_attention --reps 3 --json "$OUT/attention.json"
  part mfu_before 70 $PY -m tools.gpu_mfu --size 2b --attention reference --remat full --steps 1 --skip-matmul \
    --profile /tmp/trace_before --json "$OUT/mfu_before.json"
else
  part parity 300 $PY -m tools.gpu_parity --size tiny --dtype float32 --json "$OUT/parity.json"
  part attention 120 $PY -m tools.bench_attention --rows 1 --length 256 --reps 1 --dtype float32 \
    --json "$OUT/attention.json"
  part mfu 240 $PY -m tools.gpu_mfu --size tiny --rows 2 --length 256 --patches 64 --steps 2 --warmup 1 \
    --dtype float32 --skip-matmul --profile "$OUT/mfu_trace" --json "$OUT/mfu.json"
  part sampler 300 bash -c '$0 -m tools.bench_sampler_gpu --size tiny --steps 2 \
    --time-limit $((DEVICE_CHECK_LIMIT - 10)) --decode-options xla_cpu_enable_fast_math=false \
    --profile "$1/sampler_trace" --json "$1/sampler.json"' "$PY" "$OUT"
  part job 600 env PYTHON="$PY" bash tools/paper_job.sh --cpu --out "$OUT/paper_job" --json "$OUT/job.json"
fi

$PY -m tools.device_summary "$OUT" --seconds $(( $(date +%s) - START ))
