"""`python -m pipeline.cli`: the same as the `enginectl` console script."""

from pipeline.cli import entry

entry()
