"""Write one vendored schema file from CustomResourceDefinitions (README.md here says which
and from where), the way refresh.py writes KubeRay's: each CRD's `openAPIV3Schema` of one
named version, made strict (`refresh.strict`), `apiVersion` and `kind` as enums of their one
value, descriptions dropped and large repeated subtrees shared.

    python tests/data/schemas/refresh_crds.py --out NAME.json --source "owner/repo vX (commit)" \\
        --folder path/in/repo CRD.yaml=VERSION [CRD.yaml=VERSION ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml
from refresh import HERE, strict, write


def crd_kind(path: Path, version: str) -> tuple[str, dict[str, Any]]:
    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v.get("served")]
    api, kind = f"{crd['spec']['group']}/{version}", crd["spec"]["names"]["kind"]
    schema = strict(found["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"]["enum"] = [api]
    schema["properties"]["kind"]["enum"] = [kind]
    return f"{api}/{kind}", schema


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", required=True, help="the file name to write in this folder")
    parser.add_argument("--source", required=True, help="repository, tag and commit")
    parser.add_argument("--folder", required=True, help="where the CRDs are in that repository")
    parser.add_argument("crds", nargs="+", help="CRD.yaml=VERSION: a CRD file and the version")
    args = parser.parse_args()
    kinds = dict(crd_kind(Path(path), version)
                 for path, version in (item.rsplit("=", 1) for item in args.crds))
    write(HERE / args.out, {"from": args.source, "folder": args.folder}, {"kinds": kinds})


if __name__ == "__main__":
    main()
