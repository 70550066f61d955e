"""Where code lives, checked on the real tree (docs/architecture.md explains the layers): file and
function size, no import circles (late imports included), no import from a lower layer into a
higher one, and typed server parameters. Each rule is also shown failing on a small made-up tree."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers.import_graph import Module, cycles, read_modules

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {"llmctl": "llmctl", "kernels": "llmctl.kernels"}
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60
MAX_LOOSE_SERVER_PARAMETERS = 5

# Lowest first: a package imports only packages before it (docs/architecture.md, "Layers").
LAYERS = ("errors", "settings", "units", "cache", "logs", "version", "progress", "jsonl",  # leaves
          "checkpoint", "sizing", "plan", "kernels", "harmony", "engine",
          "quant", "inspect_report", "server", "bench", "display", "cli", "__main__", "<root>")
# Inside the engine: the driver's core runs no model, workers know no front, layers and models no step.
# Sampling runs torch on logits (driver or last stage), beside the core; the collectives know no executor.
ENGINE_FORBIDDEN = {
    "core": {"worker", "front", "executor", "distributed", "sample", "layers", "models"},
    "sample": {"worker", "front", "executor", "layers", "models"},
    "distributed": {"worker", "front", "executor", "core", "sample"},
    "worker": {"front", "executor"},
    "layers": {"core", "worker", "front", "executor", "sample"},
    "models": {"core", "worker", "front", "executor", "sample"},
}


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return read_modules(ROOT, PACKAGE_DIRS)


def package_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def upward_imports(modules: dict[str, Module]) -> list[str]:
    found = []
    for module in modules.values():
        for target in module.imports:
            low, high = package_of(target), package_of(module.name)
            if low != high and LAYERS.index(low) > LAYERS.index(high):
                found.append(f"{module.name} imports {target} ({high} is below {low})")
            engine_from, engine_to = _engine_part(module.name), _engine_part(target)
            if engine_to in ENGINE_FORBIDDEN.get(engine_from, set()):
                found.append(f"{module.name} imports {target} (engine/{engine_from} is below engine/{engine_to})")
    return sorted(found)


def _engine_part(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "engine" else None


def long_functions(path: Path, limit: int) -> list[str]:
    """Functions longer than `limit` lines, Triton kernels (@triton.jit) excepted."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            triton = any("triton" in ast.unparse(d) for d in node.decorator_list)
            length = node.end_lineno - node.lineno + 1
            if length > limit and not triton:
                found.append(f"{path.name}:{node.lineno} {node.name} ({length} lines)")
    return found


def loose_parameters(path: Path) -> list[str]:
    """Parameters annotated `Any` or `object` (or with them inside, e.g. dict[str, Any])."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None and arg.annotation is not None and \
                        {n.id for n in ast.walk(arg.annotation) if isinstance(n, ast.Name)} & {"Any", "object"}:
                    found.append(f"{path.name}:{node.lineno} {node.name}({arg.arg}: {ast.unparse(arg.annotation)})")
    return found


def python_files() -> list[Path]:
    return [p for folder in PACKAGE_DIRS for p in sorted((ROOT / folder).rglob("*.py"))]


def test_the_tree_is_read(modules):
    """The walker sees the modules and the imports the checks below rely on."""
    assert len(modules) > 100
    assert "llmctl.engine.core.scheduler" in modules["llmctl.engine.front.llm_engine"].imports
    assert "llmctl.kernels.cpu" in modules["llmctl.engine.layers.cpu_attention"].imports


def test_no_file_over_500_lines():
    assert [f"{p.relative_to(ROOT)} ({n} lines)" for p in python_files()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES] == []


def test_no_function_over_60_lines():
    assert [f for p in python_files() for f in long_functions(p, MAX_FUNCTION_LINES)] == []


def test_no_import_circles(modules):
    assert cycles(modules) == []


def test_no_upward_imports(modules):
    assert upward_imports(modules) == []


# What the server may import of the engine: the client protocol and the public types it speaks in (vLLM's
# serving layer holds an EngineClient and nothing else of the engine).
SERVER_SEES_OF_THE_ENGINE = ("llmctl.engine.config", "llmctl.engine.errors", "llmctl.engine.sampling_params",
                             "llmctl.engine.front.engine_client", "llmctl.engine.front.client_factory",
                             "llmctl.engine.front.outputs",
                             "llmctl.engine.front.stats", "llmctl.engine.front.embedding",
                             "llmctl.engine.front.beam_search", "llmctl.engine.lora.request",
                             "llmctl.engine.front.tracing",  # spans made from finished outputs
                             "llmctl.engine.structured.params", "llmctl.engine.structured.config",
                             "llmctl.engine.reasoning",
                             # pooling models: vLLM's PoolingParams and outputs, the pooler's facts, scoring's pure
                             # functions, and encoders served through transformers (as front.embedding)
                             "llmctl.engine.pooling.params", "llmctl.engine.pooling.config",
                             "llmctl.engine.pooling.scoring", "llmctl.engine.front.encoder_classifier",
                             # prompts with images: the processor runs in the server, off the event loop, before
                             # the engine (vLLM's renderer); what it makes is a public prompt type
                             "llmctl.engine.multimodal.items", "llmctl.engine.multimodal.processor")


def test_the_server_reaches_the_engine_only_through_its_client_and_public_types(modules):
    reached = sorted(f"{m.name} imports {target}" for m in modules.values() if m.name.startswith("llmctl.server.")
                     for target in m.imports if target.startswith("llmctl.engine.")
                     and not target.startswith(SERVER_SEES_OF_THE_ENGINE))
    assert reached == []


def test_server_parameters_are_typed():
    loose = [f for p in sorted((ROOT / "llmctl" / "server").rglob("*.py")) for f in loose_parameters(p)]
    assert len(loose) <= MAX_LOOSE_SERVER_PARAMETERS, loose


# -- the checks catch what they are for -------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    for name, text in files.items():
        path = tmp_path / "llmctl" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return read_modules(tmp_path, {"llmctl": "llmctl"})


def test_a_late_import_circle_is_found(tmp_path):
    modules = _tree(tmp_path, {
        "__init__.py": "", "engine/__init__.py": "", "engine/core/__init__.py": "",
        "engine/core/a.py": "from llmctl.engine.core.b import thing\n",
        "engine/core/b.py": "def thing():\n    from llmctl.engine.core import a\n",
        "engine/core/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llmctl.engine.core import a\n",
    })
    assert cycles(modules) == [["llmctl.engine.core.a", "llmctl.engine.core.b"]]
    assert modules["llmctl.engine.core.c"].imports == set()  # annotation-only imports do not count


def test_an_upward_import_is_found(tmp_path):
    modules = _tree(tmp_path, {
        "__init__.py": "", "checkpoint/__init__.py": "", "server/__init__.py": "",
        "engine/__init__.py": "", "engine/core/__init__.py": "", "engine/front/__init__.py": "",
        "checkpoint/spec.py": "from llmctl.server import app\n",
        "server/app.py": "from ..checkpoint import spec\n",
        "engine/core/scheduler.py": "from llmctl.engine.front.llm_engine import LLMEngine\n",
        "engine/front/llm_engine.py": "LLMEngine = None\n",
    })
    assert upward_imports(modules) == [
        "llmctl.checkpoint.spec imports llmctl.server.app (checkpoint is below server)",
        "llmctl.engine.core.scheduler imports llmctl.engine.front.llm_engine (engine/core is below engine/front)",
    ]


def test_long_functions_and_loose_parameters_are_found(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    path = tmp_path / "m.py"
    path.write_text(f"import triton\nfrom typing import Any\n\ndef long():\n{body}\n\n"
                    f"@triton.jit\ndef kernel():\n{body}\n\ndef loose(a: Any, b: dict[str, object], c: int):\n"
                    "    pass\n")
    assert long_functions(path, MAX_FUNCTION_LINES) == ["m.py:4 long (62 lines)"]
    assert loose_parameters(path) == ["m.py:131 loose(a: Any)", "m.py:131 loose(b: dict[str, object])"]


def test_no_test_module_imports_another_and_conftest_fixtures_are_not_redefined():
    """Shared code lives in tests/helpers/; a fixture conftest provides is not defined again in a module (but
    `server` and `client`, which a module with other serve flags defines for itself, as conftest says)."""
    tests = ROOT / "tests"
    conftest_fixtures = {node.name for node in ast.parse((tests / "conftest.py").read_text()).body
                         if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d)
                                                                      for d in node.decorator_list)}
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1].startswith(("test_", "conftest")):
                found.append(f"{path.name} imports {node.module}")
            if isinstance(node, ast.FunctionDef) and node.name in conftest_fixtures - {"server", "client"} and \
                    any("fixture" in ast.unparse(d) for d in node.decorator_list):
                found.append(f"{path.name} redefines conftest's fixture {node.name}")
    assert conftest_fixtures and found == []


# Modules about the tree as a whole (layers, docs, packaging, containers) stay at tests/'s root.
WHOLE_TREE_TESTS = {"test_architecture.py", "test_docs.py", "test_packaging.py", "test_docker.py"}


def test_tests_mirror_the_package():
    """A test module sits in the folder of the package it tests: tests/engine/core/ for llmctl/engine/core/."""
    tests = ROOT / "tests"

    def package_folder(folder: Path) -> Path:  # llmctl.kernels installs from the top-level kernels/ (pyproject)
        parts = folder.relative_to(tests).parts
        return ROOT.joinpath(*parts) if parts[:1] == ("kernels",) else ROOT.joinpath("llmctl", *parts)

    misplaced = [str(path.relative_to(tests)) for path in sorted(tests.rglob("test_*.py"))
                 if "fixtures" not in path.parts and not (
                     path.parent == tests and path.name in WHOLE_TREE_TESTS
                     or path.parent != tests and (package_folder(path.parent) / "__init__.py").is_file())]
    assert misplaced == []
