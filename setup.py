"""Packaging metadata lives in pyproject.toml; this file only finds the packages.

Every package under pipeline/ and registry/ is found, never listed by hand (a hand-written list
missed pipeline.nightly once, and an editable install hid it), and migrations/ (at the top
level, beside alembic.ini) ships as registry.migrations.
"""

from setuptools import find_namespace_packages, setup

OURS = ["pipeline", "pipeline.*", "registry", "registry.*"]
SKIP = ["*__pycache__*"]
packages = find_namespace_packages(include=OURS, exclude=SKIP)
packages += ["registry.migrations", *(
    f"registry.migrations.{name}"
    for name in find_namespace_packages(where="migrations", exclude=SKIP)
)]
setup(packages=packages)
