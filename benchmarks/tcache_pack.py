"""Packs the Triton compile-cache groups that this device call compiled or read (a file's access or change time
after the marker made when the call began), xz-compressed: gpu_session.sh's save_cache when the whole cache is over
the size a returned file may take. The times are read before anything is packed (packing reads every file).
usage: python3 tcache_pack.py CACHE_DIR ARCHIVE MARKER"""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path

SKIP = (".ptx", ".llir", ".ttir", ".ttgir", ".source")  # IRs: a later compile reuses only the cubins and metadata


def used_groups(cache: Path, since: float) -> list[Path]:
    def touched(f: Path) -> bool:
        st = os.stat(f)
        return max(st.st_atime, st.st_ctime) >= since
    return [g for g in sorted(cache.iterdir()) if g.is_dir() and any(touched(f) for f in g.rglob("*") if f.is_file())]


def main() -> int:
    cache, archive, marker = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    groups = used_groups(cache, marker.stat().st_mtime)
    with tarfile.open(archive, "w:xz") as tar:
        for group in groups:
            for f in sorted(group.rglob("*")):
                if f.is_file() and not f.name.endswith(SKIP):
                    tar.add(f, arcname=f"./{f.relative_to(cache)}")
    total = sum(1 for p in cache.iterdir() if p.is_dir())
    print(f"Triton cache: the {len(groups)} of {total} kernel groups this call used, {archive.stat().st_size >> 20} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
