"""The pipeline side of enginectl: recipes, plans, keys, stages, executors and the CLI."""
