"""`python -m perfcounter.serve`: the `perfcounter serve` command on its own."""
import sys

from perfcounter.serve.command import main

sys.exit(main())
