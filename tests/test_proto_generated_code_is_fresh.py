"""The checked-in generated code is exactly what ``proto/generate.py`` writes today."""

from pathlib import Path

from skyfed.proto import generate

PROTO_DIR = Path(generate.__file__).parent


def test_generated_protobuf_code_matches_the_proto_source(tmp_path):
    for fresh in generate.generate(tmp_path):
        checked_in = PROTO_DIR / fresh.name
        assert checked_in.read_text() == fresh.read_text(), (
            f"{checked_in} is stale: run `python -m skyfed.proto.generate`"
        )
