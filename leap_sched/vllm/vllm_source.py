"""Check the vLLM members the plugin relies on (``leap_sched.vllm.internals``) against a vLLM release's
own Python sources, without installing or importing it.

    python -m leap_sched.vllm.vllm_source --vllm '0.33.*'        # pip download the wheel (cached), check it
    python -m leap_sched.vllm.vllm_source --source PATH           # a wheel file or a folder holding vllm/

The GPU release needs CUDA to import; its sources need nothing: the wheel is read as a zip and each
class is parsed (``ast``). A member exists when the class or one of its vLLM bases defines it as a
method, a class attribute or field, or assigns ``self.member`` in a method; a method's parameters
are its signature's names. Prints one line per class and exits 0 when everything holds, 1 naming
what is missing, 2 on bad input (one line). ``--vllm`` downloads with ``pip download --no-deps``
into ``LEAP_CACHE_DIR/vllm-wheels`` and reuses a wheel already there.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from leap_sched.vllm.internals import SIGNATURES, relied_on

#: The GPU release CI checks the members against (tests/test_vllm_source.py); it has not run here.
CURRENT_RELEASE = "0.33.*"
#: The platform of the wheel ``--vllm`` downloads (vLLM's PyPI wheels: CUDA, x86_64, abi3).
WHEEL_PLATFORM = ("--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--only-binary=:all:")


class SourceError(ValueError):
    """Bad input: one line, exit 2."""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):          # one line, exit 2 (the project's bad-input rule)
        print(f"vllm_source: {message}", file=sys.stderr)
        sys.exit(2)


class Source:
    """vLLM's Python sources: a wheel (read as a zip) or a folder holding the ``vllm`` package."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._zip = zipfile.ZipFile(self.path) if self.path.is_file() else None
        if self._zip is None and not (self.path / "vllm" / "__init__.py").is_file():
            raise SourceError(f"--source {self.path}: neither a wheel nor a folder holding vllm/__init__.py")
        self._trees: dict[str, ast.Module | None] = {}

    def text(self, relpath: str) -> str | None:
        if self._zip is not None:
            try:
                return self._zip.read(relpath).decode()
            except KeyError:
                return None
        file = self.path / relpath
        return file.read_text() if file.is_file() else None

    def module(self, name: str) -> ast.Module | None:
        if name not in self._trees:
            base = name.replace(".", "/")
            text = self.text(f"{base}.py") or self.text(f"{base}/__init__.py")
            self._trees[name] = ast.parse(text) if text is not None else None
        return self._trees[name]

    def version(self) -> str:
        text = self.text("vllm/_version.py") or ""
        m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
        return m.group(1) if m else "unknown"


def _resolve(src: Source, module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
    """The class ``name`` as seen from ``module``: defined there, or imported there from a vLLM module."""
    tree = src.module(module)
    if tree is None or depth > 8:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    for imp in ast.walk(tree):
        if isinstance(imp, ast.ImportFrom):
            for alias in imp.names:
                if (alias.asname or alias.name) == name:
                    origin = _absolute(module, imp, src)
                    if origin.split(".")[0] == "vllm":
                        return _resolve(src, origin, alias.name, depth + 1)
    return None


def _absolute(module: str, node: ast.ImportFrom, src: Source) -> str:
    if not node.level:
        return node.module or ""
    package = module if src.module(module + ".__init__") is not None else module.rsplit(".", 1)[0]
    parts = package.split(".")
    parts = parts[: len(parts) - node.level + 1]
    return ".".join([*parts, node.module] if node.module else parts)


def _lineage(src: Source, module: str, cls: ast.ClassDef) -> list[ast.ClassDef]:
    """The class and its vLLM bases, nearest first."""
    out, todo = [], [(module, cls)]
    while todo:
        mod, node = todo.pop(0)
        out.append(node)
        for base in node.bases:
            if isinstance(base, ast.Name):
                found = _resolve(src, mod, base.id)
                if found is not None:
                    todo.append(found)
    return out


def _members(cls: ast.ClassDef) -> set[str]:
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for sub in ast.walk(cls):
        targets = sub.targets if isinstance(sub, ast.Assign) else \
            [sub.target] if isinstance(sub, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                names.add(t.attr)
    return names


def _params(lineage: list[ast.ClassDef], method: str) -> set[str] | None:
    for cls in lineage:
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == method:
                a = node.args
                return {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
    return None


def check_source(src: Source) -> dict[str, list[str]]:
    """Class -> what it lacks (``member``, ``method(param)``, or ``<class not found>``), for every relied-on class."""
    report = {}
    for module, name, members in relied_on():
        found = _resolve(src, module, name)
        if found is None:
            report[name] = [f"<class not found in {module}>"]
            continue
        lineage = _lineage(src, *found)
        defined = set().union(*(_members(c) for c in lineage))
        lacks = [m for m in members if m not in defined]
        for (owner, method), params in SIGNATURES.items():
            taken = _params(lineage, method) if owner == name else None
            lacks += [f"{method}({p})" for p in params if taken is not None and p not in taken]
        report[name] = lacks
    return report


def download(spec: str, cache: Path) -> Path:
    """The vLLM wheel matching ``spec`` (e.g. ``0.33.*``) from PyPI, cached in ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", f"vllm=={spec}", "--no-deps", "-d", str(cache),
                        "--disable-pip-version-check", "-q", *WHEEL_PLATFORM], capture_output=True, text=True)
    wheels = sorted(cache.glob("vllm-*.whl"), key=lambda p: p.stat().st_mtime)
    if r.returncode != 0 or not wheels:
        last = (r.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise SourceError(f"pip download vllm=={spec} failed: {last}")
    pinned = spec.replace(".*", "")
    matching = [w for w in wheels if w.name.split("-")[1].startswith(pinned)]
    return (matching or wheels)[-1]


def main(argv: list[str] | None = None) -> int:
    from core.io import cache_dir

    ap = _OneLineParser(prog="python -m leap_sched.vllm.vllm_source", description=__doc__.splitlines()[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--vllm", help="a version spec to download from PyPI, e.g. '0.33.*'")
    where.add_argument("--source", type=Path, help="a vLLM wheel, or a folder holding the vllm package")
    args = ap.parse_args(argv)
    try:
        src = Source(args.source if args.source else download(args.vllm, cache_dir() / "vllm-wheels"))
        report = check_source(src)
    except (SourceError, zipfile.BadZipFile, SyntaxError, OSError) as e:
        print(f"vllm_source: {e}", file=sys.stderr)
        return 2
    print(f"vLLM {src.version()} ({src.path.name})")
    for name, lacks in report.items():
        print(f"  {name}: {'ok' if not lacks else 'MISSING ' + ', '.join(lacks)}")
    return 1 if any(report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
