"""The import graph of llmctl's own modules, read with ast: every `import` and `from … import`,
inside functions too, except those under `if TYPE_CHECKING:` (annotations only)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Module:
    name: str  # dotted, e.g. llmctl.engine.core.scheduler
    path: Path
    imports: set[str] = field(default_factory=set)  # llmctl modules it imports


def module_name(path: Path, root: Path, package_dirs: dict[str, str]) -> str:
    """Dotted name of a file under one of the package folders (kernels/ installs as llmctl.kernels)."""
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    parts = package_dirs[parts[0]].split(".") + parts[1:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_modules(root: Path, package_dirs: dict[str, str]) -> dict[str, Module]:
    """Every module under the package folders (folder name -> dotted package), with its imports."""
    modules = {}
    for folder in package_dirs:
        for path in sorted((root / folder).rglob("*.py")):
            name = module_name(path, root, package_dirs)
            modules[name] = Module(name, path)
    for module in modules.values():
        tree = ast.parse(module.path.read_text())
        for target in _imported_names(tree, module):
            # `from a.b import c` names module a.b.c when c is a module, else a.b
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module.name:
                module.imports.add(target)
    return modules


def _imported_names(tree: ast.AST, module: Module) -> list[str]:
    annotation_only = {id(node) for block in ast.walk(tree) if _is_type_checking(block)
                       for node in ast.walk(block)}
    names = []
    for node in ast.walk(tree):
        if id(node) in annotation_only:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module)
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _resolve(node: ast.ImportFrom, module: Module) -> str:
    if not node.level:
        return node.module or ""
    package = module.name.split(".")
    if module.path.name != "__init__.py":
        package = package[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for other in sorted(modules[name].imports):
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in on_stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(modules):
        if name not in index:
            visit(name)
    return found
