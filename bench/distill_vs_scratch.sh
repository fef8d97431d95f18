#!/usr/bin/env bash
# Distillation on WikiText-2: a 6-layer teacher pretrained by nanobert, then a 3-layer
# student trained three ways for the same steps on the same data and masks:
#   distilled       student from every other teacher layer; KL(T=2) x5 + MLM x2 + cosine x1
#   init_mlm_only   the same initialisation, MLM loss only (no teacher signal)
#   scratch         random initialisation, MLM loss only
# Usage: bash bench/distill_vs_scratch.sh [OUT_DIR]   (about 30 minutes on 2 CPU cores)
set -euo pipefail
DATA="$(cd "$(dirname "$0")/../.." && pwd)/shared/data/wikitext2/wiki.valid.tokens"
[ -f "$DATA" ] || { echo "skipped: $DATA not found (needs ../shared/data)"; exit 0; }
OUT="${1:-runs/distill}"
mkdir -p "$OUT"
echo '{"vocab_size": 8000, "hidden_size": 128, "num_hidden_layers": 6, "num_attention_heads": 2,
 "intermediate_size": 512, "max_position_embeddings": 512}' > "$OUT/teacher_config.json"
sed 's/"num_hidden_layers": 6/"num_hidden_layers": 3/' "$OUT/teacher_config.json" > "$OUT/student_config.json"
COMMON="--corpus $DATA --batch-size 16 --seq-len 64 --lr 1e-3 --seed 0 --attn-backend eager --no-progress"
nanobert pretrain $COMMON --config "$OUT/teacher_config.json" --steps 800 --eval-every 200 --out "$OUT/teacher"
STUDENT="$COMMON --steps 400 --eval-every 100"
nanobert distill --teacher "$OUT/teacher" $STUDENT --out "$OUT/distilled"
nanobert distill --teacher "$OUT/teacher" $STUDENT --out "$OUT/init_mlm_only" --kl-weight 0 --cos-weight 0 --mlm-weight 1
nanobert pretrain --config "$OUT/student_config.json" --tokenizer "$OUT/teacher" $STUDENT --out "$OUT/scratch"
for run in teacher distilled init_mlm_only scratch; do
  python - "$OUT/$run/metrics.jsonl" "$run" <<'PY'
import json, sys
evals = [json.loads(l) for l in open(sys.argv[1]) if '"eval"' in l]
print(f"{sys.argv[2]:<14}", " ".join(f"{e['step']}:{e['loss']:.3f}" for e in evals))
PY
done
