"""The repository's promises: CI workflow is valid, the README and .ci/run agree, stdlib only."""

import ast
from pathlib import Path
import shutil
import subprocess
import sys

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_kind_smoke_workflow_is_a_valid_github_workflow():
    program = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name("check-jsonschema"))
    if not Path(program).exists():
        pytest.skip("check-jsonschema is not installed (pip install -e .[test])")
    done = subprocess.run([program, "--builtin-schema", "vendor.github-workflows",
                           str(ROOT / ".github" / "workflows" / "kind-smoke.yml")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_kind_smoke_workflow_checks_results_and_cleanup():
    text = (ROOT / ".github" / "workflows" / "kind-smoke.yml").read_text()
    assert "rl-batch-demo.py run --count 10" in text
    assert 'results["reward_sum"] == 10' in text and 'results["episodes"] == 10' in text
    assert "rl-batch-demo.py cleanup --output smoke-out" in text
    assert "actions/upload-artifact" in text


def test_script_imports_only_the_standard_library():
    tree = ast.parse((ROOT / "rl-batch-demo.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    stdlib = getattr(sys, "stdlib_module_names", None)
    if stdlib is None:
        pytest.skip("needs Python 3.10+ to know the standard library's names")
    assert names <= set(stdlib)


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "python3 -m pytest"
    assert command in readme and command in ci
