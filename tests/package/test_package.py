"""Packaging promises: a light import, and the CLI runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REWARDS, ROOT



@pytest.mark.local
def test_import_is_light():
    code = (
        "import sys, threading, verl_async_rm\n"
        "heavy = [m for m in ('ray', 'torch', 'verl', 'openai', 'transformers', 'aiohttp') if m in sys.modules]\n"
        "print(heavy, threading.active_count())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] 1"  # no heavy module, no thread started


@pytest.mark.local
def test_cli_scores_a_file_with_summary(tmp_path):
    rows = [{"solution_str": f"#### {i % 3}", "ground_truth": "1", "uid": i // 2} for i in range(10)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cmd = [
        sys.executable, "-m", "verl_async_rm", "score", "--input", str(src), "--group-size", "2",
        "--reward-file", str(ROOT / "verl_async_rm" / "user_rewards" / "gsm8k.py"), "--reward-name", "compute_score",
        "--set", "max_concurrency=4", "--output", str(tmp_path / "out.jsonl"), "--summary-json", str(tmp_path / "s.json"),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "summary:" in result.stdout and "samples_per_s" in result.stdout
    scored = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["score"] for r in scored] == [float(i % 3 == 1) for i in range(10)]
    assert json.loads((tmp_path / "s.json").read_text())["samples"] == 10


@pytest.mark.local
def test_cli_bad_config_is_a_clear_error(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"solution_str": "x"}\n')
    cmd = [sys.executable, "-m", "verl_async_rm", "score", "--input", str(src),
           "--reward-file", str(ROOT / "verl_async_rm" / "user_rewards" / "gsm8k.py"), "--set", "max_concurency=4"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "max_concurency" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.local
@pytest.mark.parametrize("reward, code", [("fails_on_tenth", 0), ("fails_on_odd", 3)])
def test_cli_summary_names_failures_and_exits_non_zero_past_the_budget(tmp_path, reward, code):
    """10% failures: the policy handles them (exit 0), and the summary shows their kind and first
    messages. 50%+ failures: past max_failure_rate, scoring stops with exit 3 and says why; the
    output holds the rows scored until then, and no row without a score."""
    rows = [{"solution_str": str(i)} for i in range(40)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cmd = [sys.executable, "-m", "verl_async_rm", "score", "--input", str(src), "--reward-file",
           str(REWARDS / "examples.py"), "--reward-name", reward, "--set", "max_concurrency=1",
           "--set", "max_failure_rate=0.3", "--output", str(tmp_path / "out.jsonl")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == code, result.stderr
    assert "failures_by_kind" in result.stdout and "{'error':" in result.stdout
    scored = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert all(r["score"] is not None for r in scored)
    if code:  # the error gives the kinds and the first messages
        assert "scoring stopped: FailureBudgetExceeded" in result.stderr and "of 40 samples failed" in result.stderr
        assert "failure kinds: error x" in result.stderr and "cannot judge response 1" in result.stderr
        assert any(r["score"] == 1.0 for r in scored) and len(scored) < 40
        assert f"the output holds only the {len(scored)} rows scored" in result.stderr
        assert "Traceback" not in result.stderr
    else:  # below the budget: scored by the policy, the summary names them
        assert "failure 1" in result.stdout and "cannot judge response 9" in result.stdout
        assert len(scored) == 40


# -- the product apart from the rig ----------------------------------------------------------------

PRODUCT = ("verl_async_rm", "hydra_plugins")
NOT_PRODUCT = ("verl_async_rm_rig", "tests", "bench")


def _module_name(path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(tops=PRODUCT) -> dict[str, set[str]]:
    """Module -> the modules it imports, anywhere in its file (lazy imports inside functions too), with
    relative imports resolved and ``from package import module`` read as an import of the module."""
    import ast

    modules = {_module_name(p): p for top in tops for p in (ROOT / top).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                imported.add(target)
        graph[name] = imported
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return found


@pytest.mark.quick
def test_no_product_module_imports_the_rig_tests_or_benchmarks():
    graph = import_graph()
    assert len(graph) > 50  # the scan saw the product
    upward = {module: sorted(t for t in targets if t.split(".")[0] in NOT_PRODUCT) for module, targets in graph.items()}
    assert {module: targets for module, targets in upward.items() if targets} == {}
    # nor by name, for importlib or a config string
    named = [path.relative_to(ROOT).as_posix() for top in PRODUCT for path in (ROOT / top).rglob("*.py")
             if "verl_async_rm_rig" in path.read_text()]
    assert named == []


@pytest.mark.quick
def test_the_product_has_no_import_circles():
    assert circles(import_graph()) == []


@pytest.mark.quick
def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
