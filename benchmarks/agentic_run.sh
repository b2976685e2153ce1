#!/usr/bin/env bash
# AgentX-style closed-loop run against a local v4serve server, prefix caching on and off (one device call).
# usage: bash benchmarks/agentic_run.sh MODEL "SERVER FLAGS" "BENCH FLAGS"
# RUNS (optional): the server variants, "label|extra server flags[|extra bench flags[|server env]]" separated by ';'
# (default: prefix caching on, then off); extra bench flags come after BENCH FLAGS (a later --concurrency wins); server
# env: KEY=VALUE assignments for the server process (e.g. V4SERVE_STEP_SPECIALIZE=0)
set -uo pipefail
model=${1:-v4-flash-l8-e16}; sflags=${2:-}; bflags=${3:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ "${INSTALL_WHEELS:-0}" = 1 ]; then  # the GPU machine: carried wheels (README of the device tool)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD/src || exit 1
fi
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
port=8123
run() {  # label, extra server flags, extra bench flags, server env
  env ${4:-} $PY -m v4serve.cli serve "$model" --port $port $sflags $2 > "$OUT/server-$1.log" 2>&1 &
  pid=$!
  for i in $(seq 1 ${HEALTH_WAIT:-600}); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 1; done
  grep -m1 "KV cache" "$OUT/server-$1.log"
  $PY -m v4serve.cli bench agentic --base-url http://127.0.0.1:$port --out "$OUT/$1" --label "$1" --no-progress \
      $bflags ${3:-} 2>&1 | tail -25
  curl -s http://127.0.0.1:$port/metrics | grep -E "^v4serve_(prefix|cached|prompt_tokens|preempt)" | head -20
  kill -INT $pid; wait $pid
}
RUNS=${RUNS:-"cache-on|;cache-off|--no-enable-prefix-caching"}
labels=(); files=()
IFS=';' read -ra variants <<< "$RUNS"
for v in "${variants[@]}"; do
  IFS='|' read -r label sf bf senv <<< "$v"
  run "$label" "$sf" "$bf" "$senv"
  labels+=("$label"); files+=("$OUT/$label"/agentic-*.json)
done
$PY -m v4serve.cli bench plot "${files[@]}" --out "$OUT/agentic.png" --labels "$(IFS=,; echo "${labels[*]}")" \
    --title "v4serve $model, AgentX-style synthetic" || true
