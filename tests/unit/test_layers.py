"""The layer contracts hold (import-linter, pyproject.toml [tool.importlinter]), a broken contract really fails, the
module graph has no cycle, and the controller's start-up loads no torch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("testbed", "shaping", "runners")
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(*args: str, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = None if pythonpath is None else {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120
    )


def test_project_keeps_its_layer_contracts():
    done = lint_imports(cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
    for contract in ("shaping imports nothing of testbed", "runners imports nothing", "load no torch", "no import"):
        assert contract in done.stdout  # every contract is checked, none silently dropped


def test_a_broken_contract_fails_lint(tmp_path):
    """A forbidden import and a cycle in a throwaway package make lint-imports exit 1 and name the contracts."""
    pkg = tmp_path / "layercheck"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "tool.py").write_text("from layercheck import high\n")  # the low layer reaches up: forbidden
    (pkg / "high.py").write_text("import layercheck.a\n")
    (pkg / "a.py").write_text("def f():\n    from layercheck import b  # a lazy import still closes a cycle\n")
    (pkg / "b.py").write_text("from layercheck import a\n")
    config = tmp_path / "contracts.toml"
    config.write_text(
        textwrap.dedent(
            """
            [tool.importlinter]
            root_packages = ["layercheck"]

            [[tool.importlinter.contracts]]
            name = "low imports nothing of high"
            type = "forbidden"
            source_modules = ["layercheck.low"]
            forbidden_modules = ["layercheck.high"]

            [[tool.importlinter.contracts]]
            name = "no cycles here"
            type = "acyclic_siblings"
            ancestors = ["layercheck"]
            """
        )
    )
    done = lint_imports(str(config), cwd=tmp_path, pythonpath=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "low imports nothing of high BROKEN" in done.stdout
    assert "no cycles here BROKEN" in done.stdout
    assert "2 broken" in done.stdout


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), plus self-imports."""
    modules = sorted(m for m in graph.modules if m.split(".")[0] in PACKAGES)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & set(modules)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_module_graph_is_acyclic():
    """No module reaches itself through imports, lazy (function-level) ones included."""
    graph = grimp.build_graph(*PACKAGES)
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_lazy_cycle():
    graph = grimp.ImportGraph()
    for m in ("testbed.a", "testbed.b", "testbed.c"):
        graph.add_module(m)
    graph.add_import(importer="testbed.a", imported="testbed.b")
    graph.add_import(importer="testbed.b", imported="testbed.c")
    assert _cycles(graph) == []
    graph.add_import(importer="testbed.c", imported="testbed.a")
    assert _cycles(graph) == [["testbed.a", "testbed.b", "testbed.c"]]


def test_controller_start_up_loads_no_torch():
    """What `testbed --help` imports, and the controller's config/model/report modules, leave torch unloaded; the
    host-side shaping tool loads nothing of testbed or runners."""
    code = textwrap.dedent(
        """
        import sys
        import testbed.cli, testbed.config, testbed.perfmodel, testbed.report
        testbed.cli.build_parser()
        import shaping.__main__, shaping.commit_confirm, shaping.lockout
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision")))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    code = "import sys, shaping.__main__; print(sorted(m for m in sys.modules if m.split('.')[0] in ('testbed', 'runners')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def ruff_on(source: str, as_path: str) -> subprocess.CompletedProcess:
    """The project's ruff (its pyproject settings) on `source`, as if it were the file `as_path` of the repository."""
    ruff = Path(sys.executable).with_name("ruff")
    return subprocess.run(
        [str(ruff), "check", "--no-cache", "--output-format", "concise", "--stdin-filename", as_path, "-"],
        input=source, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_private_name_used_from_another_module_fails_lint():
    """What broke shaping.commit_confirm once (tc's private `_ipr` removed, its caller missed): lint now refuses the
    call itself, in the product's packages; the tests may still reach into what they test."""
    source = "from shaping import tc\n\n\ndef check(ipr):\n    return tc._index(ipr, 'eth0', None)\n"
    done = ruff_on(source, "shaping/probe.py")
    assert done.returncode == 1 and "SLF001" in done.stdout and "_index" in done.stdout, done.stdout + done.stderr
    public = source.replace("tc._index", "tc.index")
    assert ruff_on(public, "shaping/probe.py").returncode == 0
    assert ruff_on(source, "tests/unit/shaping/probe.py").returncode == 0  # tests are exempt
