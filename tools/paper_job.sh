#!/usr/bin/env bash
# The paper config's whole job at a published model size on one accelerator: a random checkpoint of the real
# architecture, synthetic AITZ-format data at a phone's resolution, step counts cut so that every stage runs once.
#
#   bash tools/paper_job.sh --out DIR [--arch qwen2-vl-2b|qwen2-vl-7b] [--json FILE] [--cpu]
#
# 1. ipl-jax init-model: DIR/model, random bf16 weights of the architecture and our tokenizer (kept when present);
# 2. ipl-jax synth: DIR/data/{train,test}, screens laid out at AITZ's 270x600 and drawn at 1080x2400 (a phone);
#    the paper's AITZ pixel limit (1540x1540) resizes them to 1008x2268 = 11,664 patches = 2,916 image tokens;
# 3. ipl-jax run --config qwen2vl_<size>_aitz:gpu on it: data -> SFT -> start -> one IPL round -> export, with the
#    overrides below (single buckets: every program compiles once);
# 4. DIR/job.json (and --json FILE): the run's job_report.json (stage seconds, SFT and T-DPO tokens/s, peak device
#    memory) plus the seconds of steps 1 and 2; the run prints the same as a table.
# SFT steps are the paper's micro-batch (4 dialogues), T-DPO steps the paper's 16 packed rows; 2 trees per round.
# --cpu: a tiny variant of the same path on the CPU (a shrunk architecture, 270x600 screens read at 224x84), for CI.
set -euo pipefail
OUT="" ARCH=qwen2-vl-2b CPU=0 JSON=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    --cpu) CPU=1; shift ;;
    --json) JSON=$2; shift 2 ;;
    *) echo "paper_job.sh: unknown argument $1 (see the header of tools/paper_job.sh)" >&2; exit 2 ;;
  esac
done
if [ -z "$OUT" ]; then echo "paper_job.sh: --out DIR is required" >&2; exit 2; fi
case "$ARCH" in
  qwen2-vl-2b) CONFIG=qwen2vl_2b_aitz:gpu ;;
  qwen2-vl-7b) CONFIG=qwen2vl_7b_aitz:gpu ;;
  *) echo "paper_job.sh: --arch $ARCH is unknown (qwen2-vl-2b or qwen2-vl-7b)" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -n "$JSON" ]; then mkdir -p "$(dirname "$JSON")"; JSON=$(cd "$(dirname "$JSON")" && pwd)/$(basename "$JSON"); fi
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
IPL="$PY -m ipl_jax.cli"
export PYTHONUNBUFFERED=1
now() { date +%s.%N; }

INIT=() WORLD=(width=270 height=600 render_size=1080,2400) TRAIN=6 TEST=2
JOB=(
  --config.data.dev_holdout=1 --config.evolution.max_items=8
  --config.buckets.tokens=4096 --config.sampler.tree.prefix_buckets=4096 --config.sampler.tree.prompt_buckets='(256, 512)'
  --config.ipl.text_buckets='(4096, 6144)'
  --config.sft.steps=3 --config.sft.batch_size=4 --config.sft.micro_batch_size=4 --config.sft.warmup_steps=1
  --config.sft.checkpoint_every=3 --config.sft.start_candidates=1
  --config.start_selection.steps=2 --config.start_selection.embedder=tfidf --config.sampler.batch_size=2
  --config.ipl.rounds=1 --config.ipl.steps_per_round=2
  --config.eval.max_steps=4 --config.eval.batch_size=4 --config.eval.blank_splits='()'
  --config.eval.online_episodes=0 --config.export.viewer_steps=1
)
if [ "$CPU" = 1 ]; then
  export JAX_PLATFORMS=cpu
  INIT=(--override '{"vocab_size": 2048, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rope_scaling": {"mrope_section": [2, 3, 3]},
    "vision_config": {"depth": 2, "embed_dim": 32, "num_heads": 4}}')
  WORLD=(width=224 height=448 render_size=270,600) TRAIN=4 TEST=1
  JOB+=(
    --config.model.max_pixels=25088 --config.buckets.patches=128 --config.buckets.tokens=384
    --config.sampler.tree.prefix_buckets=192 --config.sampler.tree.prompt_buckets=128 --config.ipl.text_buckets=640
    --config.buckets.max_turn_tokens='(48, 32, 16, 24)' --config.sft.steps=2 --config.sft.checkpoint_every=2
    --config.sampler.tree.branching='(2, 2, 2, 1)' --config.ipl.batch_size=4
  )
fi

t0=$(now)
if [ -f "$OUT/model/config.json" ]; then
  echo "model: $OUT/model (kept)"
else
  $IPL init-model --architecture "$ARCH" --out "$OUT/model" "${INIT[@]}"
fi
t1=$(now)
rm -rf "$OUT/data"
$IPL synth --out "$OUT/data" --split train --episodes $TRAIN --seed 0 --world "${WORLD[@]}"
$IPL synth --out "$OUT/data" --split test --episodes $TEST --seed 1 --world "${WORLD[@]}"
t2=$(now)
rm -rf "$OUT/run"
RC=0
$IPL run --config "$CONFIG" --config.model.checkpoint="$OUT/model" --config.data.root="$OUT/data" \
  --workdir "$OUT/run" "${JOB[@]}" || RC=$?
t3=$(now)
[ -f "$OUT/run/job_report.json" ] || exit $RC  # stopped before its first stage ended: nothing to report
$PY - "$OUT" "$t0" "$t1" "$t2" "$t3" "$ARCH" "$CPU" "$JSON" "$RC" <<'EOF'
import json, shutil, sys
out, t0, t1, t2, t3, arch, cpu, copy = sys.argv[1], *map(float, sys.argv[2:6]), sys.argv[6], sys.argv[7] == "1", sys.argv[8]
report = json.load(open(f"{out}/run/job_report.json"))
report.update(architecture=arch, cpu=cpu, init_model_seconds=round(t1 - t0, 1), synth_seconds=round(t2 - t1, 1),
              run_seconds=round(t3 - t2, 1), run_exit=int(sys.argv[9]))
json.dump(report, open(f"{out}/job.json", "w"), indent=1)
if copy:
    shutil.copyfile(f"{out}/job.json", copy)
print(f"init-model {t1 - t0:.1f} s, synth {t2 - t1:.1f} s, run {t3 - t2:.1f} s -> {out}/job.json")
EOF
exit $RC
