"""Regenerate the protobuf/gRPC stubs under proto/ with the pinned grpcio-tools.

    python tools/gen_protos.py            rewrite the stubs in place
    python tools/gen_protos.py --check    exit 1 if the committed stubs differ from what would be generated

Every .proto under proto/ is compiled with `-I proto`, so a file's directory is its Python import path
(proto/rmd_api/agent/v1/agent.proto -> rmd_api.agent.v1.agent_pb2).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent.parent / "proto"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out: Path) -> None:
    include = str(resources.files("grpc_tools") / "_proto")
    for proto in sorted(PROTO_ROOT.rglob("*.proto")):
        rel = proto.relative_to(PROTO_ROOT)
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(rel),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {rel}")


def generated_files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.name.endswith(SUFFIXES)}


def ensure_packages(rel: Path) -> None:
    """Every directory between proto/ and a stub is a package, so the stubs import by their path."""
    for parent in [rel.parent, *rel.parent.parents][:-1]:
        (PROTO_ROOT / parent / "__init__.py").touch()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="only report drift")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        fresh = generated_files(out)
        committed = generated_files(PROTO_ROOT)
        drift = sorted(
            str(p)
            for p in fresh | committed
            if not (out / p).exists()
            or not (PROTO_ROOT / p).exists()
            or not filecmp.cmp(out / p, PROTO_ROOT / p, shallow=False)
        )
        if args.check:
            if drift:
                print(
                    "generated protobuf stubs are out of date (run python tools/gen_protos.py):",
                    *drift,
                    sep="\n  ",
                    file=sys.stderr,
                )
                return 1
            print(f"protobuf stubs up to date ({len(fresh)} files)")
            return 0
        for rel in fresh:
            (PROTO_ROOT / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out / rel, PROTO_ROOT / rel)
            ensure_packages(rel)
        for rel in committed - fresh:
            (PROTO_ROOT / rel).unlink()
        print(f"wrote {len(fresh)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
