#!/usr/bin/env bash
# Issue 12's serving comparison on several GPUs (one device call): full-size V4-Flash (random weights in its release
# formats) served with a multi-GPU layout, `v4serve bench serve` at 8K in / 1K out per concurrency, tokens/s per GPU
# (compare with SGLang's published H200 figures for V4-Flash on TP4 with MTP: 607 / 3,264 / 4,207 tok/s/GPU at
# c = 1 / 16 / 256, benchmarks/RESULTS.md).
# usage: LAYOUT="-tp 2" CONC="1 16 64 256" bash benchmarks/tp_serve.sh [MODEL]
#   LAYOUT: the serve flags of the layout ("-tp 2", "-dp 2 --enable-expert-parallel"); GPUS: per-GPU divisor (default:
#   the -tp / -dp number); PROMPTS: requests per concurrency (default 2 x concurrency, at least 4); SFLAGS: more serve
#   flags (e.g. --warmup off for a quick look); env V4SERVE_MULTI_RANK_GRAPHS / V4SERVE_ALLREDUCE pass through.
set -uo pipefail
model=${1:-v4-flash}
layout=${LAYOUT:--tp 2}
gpus=${GPUS:-$(echo "$layout" | grep -oE '[0-9]+' | head -1)}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}
port=8124
tag=$(echo "$layout" | tr -d ' -' | tr -c 'a-z0-9\n' '_')
$PY -m v4serve.cli serve "$model" --port $port $layout --max-model-len 10240 ${SFLAGS:-} > "$OUT/server-$tag.log" 2>&1 &
pid=$!
for i in $(seq 1 ${HEALTH_WAIT:-900}); do
  curl -sf http://127.0.0.1:$port/health >/dev/null && break
  kill -0 $pid 2>/dev/null || { echo "server exited"; tail -30 "$OUT/server-$tag.log"; exit 1; }
  sleep 1
done
grep -m3 -E "weight bytes|KV cache|captured" "$OUT/server-$tag.log"
for c in ${CONC:-1 16 64 256}; do
  n=${PROMPTS:-$(( c * 2 > 4 ? c * 2 : 4 ))}
  echo "== concurrency $c ($n prompts)"
  $PY -m v4serve.cli bench serve --base-url http://127.0.0.1:$port --input-len 8192 --output-len 1024 \
    --num-prompts "$n" --max-concurrency "$c" --num-gpus "$gpus" --out "$OUT/serve-$tag-c$c" 2>&1 | tail -14
done
kill -INT $pid; wait $pid
