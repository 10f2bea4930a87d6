"""Generate the protobuf and gRPC modules from ``federation.proto`` with grpcio-tools.

The generated files are checked in; ``tests/test_proto_generated_code_is_fresh.py`` fails
when they differ from what this script writes.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("federation.proto",)
OUTPUTS = ("federation_pb2.py", "federation_pb2.pyi", "federation_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    """Write the generated modules into ``out_dir``; return their paths."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        # Compile from a tree shaped like the import path so imports read
        # ``from skyfed.proto import federation_pb2``.
        src_root = Path(tmp) / "src"
        pkg = src_root / "skyfed" / "proto"
        pkg.mkdir(parents=True)
        for name in SOURCES:
            shutil.copy(HERE / name, pkg / name)
        gen_root = Path(tmp) / "gen"
        gen_root.mkdir()
        args = [
            "protoc",
            f"-I{src_root}",
            f"--python_out={gen_root}",
            f"--pyi_out={gen_root}",
            f"--grpc_python_out={gen_root}",
            *(f"skyfed/proto/{name}" for name in SOURCES),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in OUTPUTS:
            shutil.copy(gen_root / "skyfed" / "proto" / name, out_dir / name)
    return [out_dir / name for name in OUTPUTS]


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(path)
