# Sourced by gpu_session.sh and gpu_multi.sh: `save_cache` returns Triton's compile cache ($TRITON_CACHE_DIR) as
# $OUT/tcache.tgz (xz; split into tcache.tgz and tcache.tgz.1 when over the 16 MiB a returned file may take), so that
# the next call, which unpacks the repo root's .tcache.tgz first, recompiles only the kernels that changed.
save_cache() {
  # the cubins and their metadata are what a later compile reuses (Triton reads a kernel's group without its IRs)
  local ex=(--exclude="*.ptx" --exclude="*.llir" --exclude="*.ttir" --exclude="*.ttgir" --exclude="*.source")
  tar -cJf /tmp/tcache.tgz "${ex[@]}" -C "$TRITON_CACHE_DIR" . 2>/dev/null || return
  # at most 8 files come back from $OUT: a cache whose second part would not (a truncated archive) is not returned
  local n; n=$(find "$OUT" -type f | wc -l)
  if (( $(stat -c %s /tmp/tcache.tgz) < 16000000 )); then (( n < 8 )) && cp /tmp/tcache.tgz "$OUT/tcache.tgz"
  elif (( n > 6 )); then echo "Triton cache not returned: $n files in \$OUT leave no room for its two parts"
  elif (( $(stat -c %s /tmp/tcache.tgz) < 30000000 )); then
    head -c 15000000 /tmp/tcache.tgz > "$OUT/tcache.tgz"; tail -c +15000001 /tmp/tcache.tgz > "$OUT/tcache.tgz.1"
  else echo "Triton cache $(du -h /tmp/tcache.tgz | cut -f1) compressed: too large to return"; fi
}
