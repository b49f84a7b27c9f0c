"""rl-batch-demo's Python API: `import rl_batch_demo`, then run_batch(...) or stream_batch(...).

This module is a stand-in: importing it loads the tool's one file, rl-batch-demo.py, under
this name (rl_batch_demo_cli.load), so the API and the command are the same code.
"""

import sys

from rl_batch_demo_cli import load

sys.modules[__name__] = load()
