#!/usr/bin/env bash
# Several gpu_session.sh modes in one device call: each writes to its own folder, then everything comes back as two
# files, $OUT/results.tgz (every mode's files) and $OUT/tcache.tgz (Triton's compile cache, as gpu_session.sh returns
# it), so that no mode's files crowd the cache out of the few files a call may return.
# usage (on the GPU machine, repo root): OUT=... bash benchmarks/gpu_multi.sh MODE [MODE ...]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/multi; rm -rf $W; mkdir -p $W
start=$SECONDS
for mode in "$@"; do  # each mode cut at DEADLINE seconds (default 550) after the start, leaving time to pack
  left=$(( ${DEADLINE:-550} - (SECONDS - start) ))
  (( left > 10 )) || { echo "=== $mode skipped: no time left"; continue; }
  echo "=== $mode ($(date +%T), ${left} s left)"
  mkdir -p "$W/$mode"
  NO_CACHE_RETURN=1 OUT="$W/$mode" timeout $left bash benchmarks/gpu_session.sh "$mode"
done
tar -czf "$OUT/results.tgz" -C $W . 2>/dev/null
# gpu_session.sh left the cache in /tmp/tcache
source benchmarks/tcache.sh
TRITON_CACHE_DIR=/tmp/tcache save_cache
ls -la "$OUT"
