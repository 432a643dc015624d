"""The `perfcounter` command: one file per subcommand and the shared flags. The top layer.
"""
from perfcounter.cli.main import console, main  # noqa: F401  (the console script)
