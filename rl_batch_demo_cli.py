"""Entry points of the installed package: the `rl-batch-demo` command, and the module that
`import rl_batch_demo` (the Python API) loads.

The tool is one file, rl-batch-demo.py; a dashed name cannot be imported, so this shim finds
that file and loads it as the module `rl_batch_demo`: next to this module in a checkout (an
editable install, so edits reach the command), else where pip installed the script.
"""

import importlib.util
from pathlib import Path
import sys
import sysconfig


def script_path():
    for folder in (Path(__file__).resolve().parent, Path(sysconfig.get_path("scripts")),
                   Path(sys.executable).parent):
        if (folder / "rl-batch-demo.py").is_file():
            return folder / "rl-batch-demo.py"
    raise SystemExit("Error: rl-batch-demo.py is not installed next to %s; reinstall rl-batch-demo" % __file__)


def load():
    """rl-batch-demo.py as the module `rl_batch_demo` (loaded once)."""
    loaded = sys.modules.get("rl_batch_demo")
    if loaded is not None and hasattr(loaded, "run_batch"):
        return loaded
    spec = importlib.util.spec_from_file_location("rl_batch_demo", script_path())
    module = importlib.util.module_from_spec(spec)
    sys.modules["rl_batch_demo"] = module
    spec.loader.exec_module(module)
    return module


def main():
    module = load()
    sys.argv[0] = "rl-batch-demo"
    return module.main()


if __name__ == "__main__":
    sys.exit(main())
