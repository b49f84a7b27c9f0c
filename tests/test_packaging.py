"""The repository's promises: CI workflow is valid, the README and .ci/run agree, stdlib only."""

import ast
import json
from pathlib import Path
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import find_python, read


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
    assert "for out in smoke-out warm-out queued-out" in text and 'rl-batch-demo.py cleanup --output "$out"' in text
    assert "actions/upload-artifact" in text


def test_kind_smoke_workflow_runs_a_warm_pool_batch_on_a_pinned_agent_sandbox(tool):
    text = (ROOT / ".github" / "workflows" / "kind-smoke.yml").read_text()
    assert "AGENT_SANDBOX_VERSION: %s" % tool.AGENT_SANDBOX_VERSION in text
    assert "releases/download/${AGENT_SANDBOX_VERSION}/sandbox-with-extensions.yaml" in text
    assert "run --backend warm-pool --count 5" in text and 'results["backend"] == "warm-pool"' in text


def test_kind_smoke_workflow_runs_a_queued_batch_on_a_pinned_kueue(tool):
    text = (ROOT / ".github" / "workflows" / "kind-smoke.yml").read_text()
    assert "KUEUE_VERSION: %s" % tool.KUEUE_VERSION in text
    assert "--queue smoke --cluster-queue smoke" in text and 'results["queue"]["admission_cycles"] >= 1' in text


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


def source_copy(folder):
    """The checkout copied (its symlink kept), to build from: a build writes its scratch trees
    into the source folder, and two builds of one checkout at once (two suites) tore each
    other's down."""
    import shutil
    return Path(shutil.copytree(ROOT, folder / "src", symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The wheel, built as pip builds it, offline (the test extra installs setuptools)."""
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(dist), str(source_copy(dist))],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return next(dist.glob("*.whl"))


def fresh_venv(path, *options):
    subprocess.run([sys.executable, "-m", "venv", *options, str(path)], check=True, timeout=300)
    return path / "bin"


def test_the_wheel_installs_the_rl_batch_demo_command_and_the_example(built, tmp_path):
    bin_dir = fresh_venv(tmp_path / "venv")
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(built)],
                   check=True, timeout=300)
    version = subprocess.run([str(bin_dir / "rl-batch-demo"), "--version"], capture_output=True, text=True)
    assert (version.returncode, version.stdout.strip()) == (0, "rl-batch-demo 0.1.0"), version
    examples = ROOT / "examples"  # shipped in the source package (MANIFEST.in), not installed
    run = subprocess.run([str(bin_dir / "rl-batch-demo"), "run", "--backend", "local", "--episode",
                          str(examples / "sum_episode.py"), "--tasks", str(examples / "sum_tasks.jsonl"),
                          "--output", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "out" / "results.json").read_text())["episodes"] == 4
    # the Python API, from the installed package (outside the checkout)
    loop = ("import rl_batch_demo; r = rl_batch_demo.run_batch(backend='local', episode=%r, tasks=%r, output=%r); "
            "print(r.rewards)" % (str(examples / "sum_episode.py"), str(examples / "sum_tasks.jsonl"),
                                  str(tmp_path / "api")))
    api = subprocess.run([str(bin_dir / "python"), "-c", loop], capture_output=True, text=True, timeout=300,
                         cwd=str(tmp_path))
    assert api.returncode == 0, api.stderr
    assert len(json.loads(api.stdout)) == 4


def test_an_editable_install_runs_the_checkouts_script(tmp_path):
    # The new venv borrows this environment's pip and setuptools (the test extra's), through a
    # .pth file, so no index is needed (a venv's own bundled setuptools may be too old for
    # pyproject's license field, and the base interpreter's may be too)
    bin_dir = fresh_venv(tmp_path / "venv", "--without-pip")
    site = subprocess.run([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-e", str(ROOT)], check=True, timeout=600, capture_output=True)
    where = subprocess.run([str(bin_dir / "python"), "-c", "import rl_batch_demo; print(rl_batch_demo.__file__)"],
                           capture_output=True, text=True, cwd=str(tmp_path))
    assert Path(where.stdout.strip()).resolve() == ROOT / "rl-batch-demo.py", where


def test_the_source_package_carries_what_its_tests_and_example_need(tmp_path):
    import tarfile
    done = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path),
                           str(source_copy(tmp_path))],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with tarfile.open(next(tmp_path.glob("*.tar.gz"))) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    for needed in ("rl-batch-demo.py", "rl_batch_demo.py", "tests/conftest.py", "tests/fakecluster/server.py",
                   "tests/fakecluster/kubectl.py", "tests/episodes/scripted.py", "examples/sum_episode.py",
                   "examples/sum_tasks.jsonl", "benchmarks/collection.py"):
        assert needed in names, needed


def test_a_batch_runs_with_the_tool_on_python_3_9(cluster, run_tool, tmp_path):
    result = run_tool("run", "--count", "3", "--output", "out", cluster=cluster, python=find_python("3.9"))
    assert result.code == 0, result
    assert read(tmp_path / "out" / "results.json")["reward_sum"] == 3
    assert run_tool("cleanup", "--output", "out", cluster=cluster, python=find_python("3.9")).code == 0


def test_cli_runs_on_python_3_9(tmp_path):
    python = find_python("3.9")
    script = Path(__file__).resolve().parent.parent / "rl-batch-demo.py"
    done = subprocess.run([python, str(script), "run", "--help"], text=True, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--parallelism" in done.stdout


def test_the_module_docstrings_section_map_names_every_banner_in_order():
    """The file's map of its sections (its docstring) and its banners agree: a reader can find a
    backend, the Kueue gate, cleanup or the report without searching."""
    import re
    text = (ROOT / "rl-batch-demo.py").read_text()
    mapped = re.findall(r"^    (\w[\w ,-]+?)\s{2,}\S", text.split("Sections of this file", 1)[1].split('"""', 1)[0],
                        re.M)
    lines, rule = text.splitlines(), "# " + "=" * 76
    # a banner: a rule, its title (one line or more), a rule
    starts = [i for i, line in enumerate(lines) if line == rule]
    banners = [lines[start + 1][2:] for start, end in zip(starts[::2], starts[1::2])]
    assert len(mapped) == len(banners), (mapped, banners)
    for name, banner in zip(mapped, banners):
        assert banner.startswith(name), (name, banner)


def test_no_function_of_the_tool_is_over_100_lines():
    import ast
    tree = ast.parse((ROOT / "rl-batch-demo.py").read_text())
    long = sorted((node.end_lineno - node.lineno + 1, node.name) for node in ast.walk(tree)
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 100)
    assert long == []


def test_run_and_pool_up_share_one_declaration_of_the_sandbox_options():
    import rl_batch_demo
    parsers = [rl_batch_demo.build_parser().parse_known_args(argv)[0].subparser
               for argv in (["run"], ["pool", "up", "--size", "1", "--output", "-"])]
    helps = [{option: action.help for action in parser._actions for option in action.option_strings}
             for parser in parsers]
    for option in ("--context", "--image", "--runtime", "--no-runtime-class", "--network"):
        assert helps[0][option] == helps[1][option], option


def test_no_test_module_defines_a_test_twice():
    # a second definition silently replaces the first, which then never runs
    import ast
    import collections
    twice = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        names = [node.name for node in ast.parse(path.read_text()).body
                 if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
        repeated = [name for name, count in collections.Counter(names).items() if count > 1]
        if repeated:
            twice[path.name] = repeated
    assert twice == {}


def every_option(parser):
    """Every option string of a parser and of its subcommands' parsers, at any depth."""
    import argparse
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= every_option(sub)
    return found


def test_every_flag_the_readme_names_exists(tool):
    import re
    text = re.sub(r"\]\([^)]*\)", "]", (ROOT / "README.md").read_text())  # link targets are no flags
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text)) - {"--help"}
    assert named, "the README names no flag"
    assert sorted(named - every_option(tool.build_parser())) == []


def test_the_readme_is_a_guide_a_newcomer_reads_in_ten_minutes():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300  # the rest is in docs/reference.md


def test_the_real_control_plane_benchmarks_help_says_what_it_measures_whole():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "real_control_plane.py"), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Figures, per case:" in done.stdout and "complete->exit" in done.stdout
    assert "--episode-seconds" in done.stdout and "how long each synthetic episode runs" in done.stdout
