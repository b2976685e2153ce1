"""Lower layers never import higher ones (docs/architecture.md). Read from the source with `ast`, so an import
hidden inside a function or under TYPE_CHECKING counts too and nothing is imported to check it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# package -> packages it must never import (submodules included)
FORBIDDEN = {
    "v4serve.cache": ("v4serve.engine", "v4serve.models", "v4serve.server"),
    "v4serve.ops": ("v4serve.models", "v4serve.engine", "v4serve.server"),  # ops/ may read cache/formats.py
    "v4serve.models": ("v4serve.engine", "v4serve.server"),
}


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, src: Path) -> set[str]:
    """Absolute names of every module `path` imports (`from x import y` yields both x and x.y: y may be a module)."""
    mod = module_name(path, src)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def violations(package: str, banned: tuple[str, ...], src: Path = SRC) -> list[str]:
    out = []
    for path in sorted((src / package.replace(".", "/")).rglob("*.py")):
        for name in sorted(imported_modules(path, src)):
            if any(name == b or name.startswith(b + ".") for b in banned):
                out.append(f"{path.relative_to(src).as_posix()} imports {name}")
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_higher_ones(package: str) -> None:
    assert violations(package, FORBIDDEN[package]) == []


def test_the_check_sees_relative_and_lazy_imports(tmp_path: Path) -> None:
    """The import cache/manager.py had (`from ..engine.request import Request`), here inside a function."""
    pkg = tmp_path / "v4serve" / "cache"
    pkg.mkdir(parents=True)
    (pkg / "manager.py").write_text("from .prefix import x\n\ndef f():\n    from ..engine.request import Request\n")
    (pkg / "pool.py").write_text("import v4serve.engine.runner as r\n")
    assert violations("v4serve.cache", ("v4serve.engine",), tmp_path) == [
        "v4serve/cache/manager.py imports v4serve.engine.request",
        "v4serve/cache/manager.py imports v4serve.engine.request.Request",
        "v4serve/cache/pool.py imports v4serve.engine.runner",
    ]
