"""The recipe: schema and reader.

    fields     the literal types, the size limits, the strict base model and field helpers
    model      the `model` section (source, revision, architecture)
    matrix     the `matrix` section (axes, shapes, exclude/include selections)
    schema     the stage sections and `Recipe`, the whole document
    messages   how an error is worded (field path, YAML line, "did you mean")
    reader     `load_recipe` / `parse_recipe` -> `LoadedRecipe`

Pure: reading validates the recipe file and touches nothing else (the model source is read
in `pipeline.planning.source`). May import `pipeline.errors` and `registry` (GPU catalog,
canonical JSON, digests); imports nothing of planning, stages, executors or the CLI.
"""
