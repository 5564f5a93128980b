"""Regenerate the Python code and stubs for proto/ (the schema's one source of truth).

`--check` regenerates into a temporary directory and fails when the committed
files differ, so a schema edit without regeneration cannot land.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "src"
GENERATED = (
    "servegraph/v1/graph_pb2.py",
    "servegraph/v1/graph_pb2.pyi",
    "servegraph/v1/service_pb2.py",
    "servegraph/v1/service_pb2.pyi",
    "servegraph/v1/service_pb2_grpc.py",
)


def generate(out: Path) -> None:
    include = Path(protoc.__file__).parent / "_proto"
    sources = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    code = protoc.main(
        [
            "protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *sources,
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    parser.add_argument("--src", type=Path, default=OUT_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args()
    out_dir: Path = args.src
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            name
            for name in GENERATED
            if not (out_dir / name).exists() or not filecmp.cmp(Path(tmp) / name, out_dir / name, shallow=False)
        ]
        if args.check:
            for name in stale:
                print(f"stale generated file: src/{name} (run `make proto`)", file=sys.stderr)
            return 1 if stale else 0
        for name in GENERATED:
            shutil.copyfile(Path(tmp) / name, out_dir / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
