"""python -m perfcounter.cli: the `perfcounter` command."""
from perfcounter.cli import console

console()
