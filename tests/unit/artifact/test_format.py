"""Writer/reader round trip and every validation error the reader must raise."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from ninfer.artifact import errors
from ninfer.artifact.format import DATA_ALIGNMENT, MAGIC, PREAMBLE_SIZE, TENSOR_ALIGNMENT
from ninfer.artifact.reader import Artifact
from support.artifact_files import make_header, rewrite_header, write_artifact


def test_round_trip_is_bit_exact_and_zero_copy(artifact: tuple[Path, dict]) -> None:
    path, written = artifact
    with Artifact(path) as art:
        assert art.components == ["text"]
        assert art.preamble.data_offset % DATA_ALIGNMENT == 0
        loaded = art.load("text")
        assert set(loaded) == {n.removeprefix("text.") for n in written}
        for name, t in written.items():
            got = loaded[name.removeprefix("text.")]
            assert got.dtype == torch.bfloat16
            assert torch.equal(got.view(torch.int16), t.view(torch.int16))
        for e in art.entries():
            assert e.offset % TENSOR_ALIGNMENT == 0
        # zero-copy: the tensor's storage lies inside the mapping; writes never reach the file
        emb = loaded["embed_tokens.weight"]
        emb.zero_()
    with Artifact(path) as again:
        assert torch.equal(
            again.tensor("text.embed_tokens.weight").view(torch.int16),
            written["text.embed_tokens.weight"].view(torch.int16),
        )


def test_loading_only_requested_component(artifact: tuple[Path, dict]) -> None:
    path, _ = artifact
    with Artifact(path) as art, pytest.raises(errors.MissingComponentError, match="vision"):
        art.load("vision")


@pytest.fixture
def artifact(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    path = tmp_path / "unit.ninfer"
    return path, write_artifact(path)


def _expect(
    path: Path, exc: type[errors.ArtifactError], match: str, *, verify: bool = False
) -> str:
    with pytest.raises(exc, match=match) as info, Artifact(path) as art:
        if verify:
            art.verify()
    msg = str(info.value)
    assert str(path) in msg and "\n" not in msg
    return msg


def test_wrong_magic(artifact: tuple[Path, dict]) -> None:
    path, _ = artifact
    raw = bytearray(path.read_bytes())
    raw[:8] = b"GGUF\0\0\0\0"
    path.write_bytes(bytes(raw))
    _expect(path, errors.BadMagicError, "wrong magic")


def test_unsupported_version(artifact: tuple[Path, dict]) -> None:
    path, _ = artifact
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, len(MAGIC), 2)
    path.write_bytes(bytes(raw))
    _expect(path, errors.UnsupportedVersionError, "version 2 is not supported")


@pytest.mark.parametrize("keep", [4, 40, PREAMBLE_SIZE + 10, -100])
def test_truncated_file(artifact: tuple[Path, dict], keep: int) -> None:
    path, _ = artifact
    raw = path.read_bytes()
    path.write_bytes(raw[:keep])
    exc = errors.BadMagicError if 0 <= keep < 8 else errors.TruncatedError
    _expect(path, exc, "truncated|ends inside|magic")


def test_tensor_out_of_range(artifact: tuple[Path, dict]) -> None:
    path, _ = artifact

    def edit(doc: dict) -> None:
        doc["tensors"]["text.norm.weight"]["offset"] = doc["data_size"] + 256

    rewrite_header(path, edit)
    _expect(path, errors.TensorRangeError, "text.norm.weight.*outside the data section")


def test_tensor_size_disagrees_with_shape(artifact: tuple[Path, dict]) -> None:
    path, _ = artifact

    def edit(doc: dict) -> None:
        doc["tensors"]["text.norm.weight"]["nbytes"] += 2

    rewrite_header(path, edit)
    _expect(path, errors.TensorRangeError, "claims")


def test_header_checksum_mismatch(artifact: tuple[Path, dict]) -> None:
    path, _ = artifact

    def edit(doc: dict) -> None:
        doc["metadata"]["name"] = "tampered"

    rewrite_header(path, edit, fix_sha=False)
    _expect(path, errors.ChecksumError, "header checksum")


def test_tensor_checksum_mismatch(artifact: tuple[Path, dict]) -> None:
    path, _ = artifact
    with Artifact(path) as art:
        e = art.header.tensors["text.layers.0.linear_attn.A_log"]
        at = art.preamble.data_offset + e.offset
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    # opening still works (header intact); reading the damaged tensor fails
    with Artifact(path) as art:
        art.tensor("text.norm.weight")
        with pytest.raises(errors.ChecksumError, match="A_log.*checksum"):
            art.tensor("text.layers.0.linear_attn.A_log")
    _expect(path, errors.ChecksumError, "checksum", verify=True)


def test_missing_required_tensor(tmp_path: Path) -> None:
    path = tmp_path / "m.ninfer"
    write_artifact(path, drop="layers.3.self_attn.k_norm.weight")
    _expect(path, errors.MissingTensorError, "text.layers.3.self_attn.k_norm.weight is missing")


def test_shape_inconsistent_with_config(artifact: tuple[Path, dict]) -> None:
    path, _ = artifact

    def edit(doc: dict) -> None:
        doc["config"]["text"]["intermediate_size"] = 64

    rewrite_header(path, edit)
    _expect(
        path, errors.ShapeMismatchError, r"mlp.gate_proj.weight has shape \[48, 32\].*\[64, 32\]"
    )


def test_unknown_weight_format(artifact: tuple[Path, dict]) -> None:
    path, _ = artifact

    def edit(doc: dict) -> None:
        doc["tensors"]["text.norm.weight"]["format"] = "nvfp9"

    rewrite_header(path, edit)
    _expect(path, errors.UnknownWeightFormatError, "unknown weight format 'nvfp9'")


def test_corrupt_json_header(artifact: tuple[Path, dict]) -> None:
    path, _ = artifact
    raw = bytearray(path.read_bytes())
    raw[PREAMBLE_SIZE] = ord("[")  # still the same length; sha fixed below
    from ninfer.artifact.format import pack_preamble, sha256

    _, _, _, hlen, data_offset, _ = struct.unpack_from("<8sIIQQ32s", raw)
    header = bytes(raw[PREAMBLE_SIZE : PREAMBLE_SIZE + hlen])
    raw[:PREAMBLE_SIZE] = pack_preamble(hlen, data_offset, sha256(header))
    path.write_bytes(bytes(raw))
    _expect(path, errors.CorruptHeaderError, "not valid JSON")


def test_writer_refuses_wrong_shape_and_missing_tensors(tmp_path: Path) -> None:
    from ninfer.artifact.writer import ArtifactWriter, TensorPlan

    plans = [
        TensorPlan("text.x", "text", "bf16", (2, 3)),
        TensorPlan("text.y", "text", "f32", (4,)),
    ]
    w = ArtifactWriter(tmp_path / "w.ninfer", make_header(), plans)
    with pytest.raises(errors.ArtifactError, match="planned bf16"):
        w.write("text.x", torch.zeros(3, 2, dtype=torch.bfloat16))
    w.write("text.x", torch.zeros(2, 3, dtype=torch.bfloat16))
    with pytest.raises(errors.ArtifactError, match="never written"):
        w.close()
    assert not (tmp_path / "w.ninfer").exists()
    assert not list(tmp_path.iterdir())  # the partial file is gone too


def test_tensors_outlive_a_closed_artifact(artifact: tuple[Path, dict]) -> None:
    path, written = artifact
    with Artifact(path) as art:
        loaded = art.load("text")
    import gc

    gc.collect()
    emb = loaded["embed_tokens.weight"]  # still mapped: reading it must not crash
    assert torch.equal(emb.view(torch.int16), written["text.embed_tokens.weight"].view(torch.int16))


def test_two_writers_of_one_path_each_finish_a_whole_file(tmp_path: Path) -> None:
    """Two processes building one artifact at once (the demo on first use by two commands):
    each streams into a partial file of its own, so neither truncates or renames the other's
    bytes; both close cleanly and the path holds the last one's complete, checksummed file."""
    from ninfer.artifact import schema
    from ninfer.artifact.writer import ArtifactWriter, TensorPlan

    path = tmp_path / "same.ninfer"
    shapes = schema.component_tensors(make_header().config, "text")
    plans = [TensorPlan(f"text.{rel}", "text", "f32", tuple(s)) for rel, s in shapes.items()]
    first = {p.name: torch.randn(p.shape) for p in plans}
    second = {p.name: torch.randn(p.shape) for p in plans}
    names = list(first)
    a = ArtifactWriter(path, make_header(), plans)
    a.write(names[0], first[names[0]])
    b = ArtifactWriter(path, make_header(), plans)  # opened while `a` is half written
    for name, t in second.items():
        b.write(name, t)
    for name in names[1:]:
        a.write(name, first[name])
    assert a.close() == path
    with Artifact(path) as art:
        art.verify()
        assert all(torch.equal(art.tensor(n), t) for n, t in first.items())
    assert b.close() == path
    with Artifact(path) as art:
        art.verify()
        for name, t in second.items():
            assert torch.equal(art.tensor(name), t)
    assert [p.name for p in tmp_path.iterdir()] == ["same.ninfer"]  # no partial file left


def test_a_written_artifact_has_the_permissions_of_a_plain_open(tmp_path: Path) -> None:
    import os

    umask = os.umask(0o022)
    os.umask(umask)
    path = tmp_path / "perm.ninfer"
    write_artifact(path)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
