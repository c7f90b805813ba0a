"""The `.ninfer` v3 container layout: preamble, JSON header, aligned tensor data.

This module only knows bytes and JSON; it imports neither torch nor the model. `docs/artifact.md`
is the normative description; the constants here are its single source of truth in code.

    offset 0   preamble (64 bytes): magic, version, flags, header length, data offset,
               sha256(header)
    offset 64  JSON header (UTF-8), `header_len` bytes
    data_offset (4096-aligned)  tensor data; each tensor starts on a 256-byte boundary
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ninfer.artifact.errors import (
    BadMagicError,
    CorruptHeaderError,
    TruncatedError,
    UnknownWeightFormatError,
    UnsupportedVersionError,
)

MAGIC = b"\x89NINFER\n"
VERSION = 3
PREAMBLE = struct.Struct("<8sIIQQ32s")  # magic, version, flags, header_len, data_offset, sha256
PREAMBLE_SIZE = 64  # PREAMBLE.size (64) padded; kept explicit so the layout never drifts
DATA_ALIGNMENT = 4096  # data section start: a page boundary, so mmap views are page aligned
TENSOR_ALIGNMENT = 256  # each tensor: enough for vectorised and TMA loads

COMPONENTS = ("text", "mtp", "vision", "dflash")

# Storage dtypes by their header spelling: (bytes per element, torch dtype name).
DTYPES: dict[str, tuple[int, str]] = {
    "f32": (4, "float32"),
    "f16": (2, "float16"),
    "bf16": (2, "bfloat16"),
    "f8_e4m3": (1, "float8_e4m3fn"),
    "i64": (8, "int64"),
    "i32": (4, "int32"),
    "u8": (1, "uint8"),
}

# Weight formats: how a tensor's bytes become a usable weight.
#   plain         the stored dtype is the weight's dtype
#   fp8_block128  e4m3 values; `scale` names an f32 tensor [ceil(rows/128), ceil(cols/128)] (per
#                 expert for 3-D tensors) whose entries multiply each 128x128 block to dequantize
#   scale         a block-scale tensor that belongs to an fp8_block128 weight
WEIGHT_FORMATS = ("plain", "fp8_block128", "scale")
FP8_BLOCK = 128

assert PREAMBLE.size <= PREAMBLE_SIZE


def align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class TensorEntry:
    """One row of the tensor table. `offset` is relative to the data section."""

    name: str
    component: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    format: str = "plain"
    scale: str | None = None
    crc32: str = "00000000"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "component": self.component,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "offset": self.offset,
            "nbytes": self.nbytes,
            "format": self.format,
            "crc32": self.crc32,
        }
        if self.scale is not None:
            out["scale"] = self.scale
        return out

    @classmethod
    def from_json(cls, path: str | Path, name: str, d: dict[str, Any]) -> TensorEntry:
        try:
            entry = cls(
                name=name,
                component=str(d["component"]),
                dtype=str(d["dtype"]),
                shape=tuple(int(x) for x in d["shape"]),
                offset=int(d["offset"]),
                nbytes=int(d["nbytes"]),
                format=str(d.get("format", "plain")),
                scale=d.get("scale"),
                crc32=str(d.get("crc32", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptHeaderError(
                path, f"tensor {name!r} has a malformed table entry ({e})"
            ) from e
        if entry.format not in WEIGHT_FORMATS:
            raise UnknownWeightFormatError(
                path, f"tensor {name!r} uses unknown weight format {entry.format!r}"
            )
        if entry.dtype not in DTYPES:
            raise UnknownWeightFormatError(
                path, f"tensor {name!r} uses unknown dtype {entry.dtype!r}"
            )
        if entry.component not in COMPONENTS:
            raise CorruptHeaderError(
                path, f"tensor {name!r} belongs to unknown component {entry.component!r}"
            )
        return entry


@dataclass
class Header:
    """The decoded JSON header. Field meanings are specified in docs/artifact.md."""

    metadata: dict[str, Any]
    config: dict[str, Any]
    tokenizer: dict[str, Any]
    chat_templates: dict[str, str]
    default_chat_template: str
    generation: dict[str, Any]
    tensors: dict[str, TensorEntry] = field(default_factory=dict)
    data_size: int = 0

    @property
    def components(self) -> list[str]:
        return [c for c in COMPONENTS if self.config.get(c) is not None]

    def to_json_bytes(self) -> bytes:
        doc = {
            "format": "ninfer",
            "version": VERSION,
            "metadata": self.metadata,
            "config": self.config,
            "components": self.components,
            "tokenizer": self.tokenizer,
            "chat_templates": self.chat_templates,
            "default_chat_template": self.default_chat_template,
            "generation": self.generation,
            "data_size": self.data_size,
            "tensors": {name: e.to_json() for name, e in self.tensors.items()},
        }
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json_bytes(cls, path: str | Path, raw: bytes) -> Header:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CorruptHeaderError(
                path, f"header is not valid JSON ({e.__class__.__name__})"
            ) from e
        if not isinstance(doc, dict) or doc.get("format") != "ninfer":
            raise CorruptHeaderError(path, "header does not describe a ninfer artifact")
        try:
            tensors = {
                name: TensorEntry.from_json(path, name, d) for name, d in doc["tensors"].items()
            }
            return cls(
                metadata=dict(doc["metadata"]),
                config=dict(doc["config"]),
                tokenizer=dict(doc["tokenizer"]),
                chat_templates=dict(doc["chat_templates"]),
                default_chat_template=str(doc["default_chat_template"]),
                generation=dict(doc["generation"]),
                tensors=tensors,
                data_size=int(doc["data_size"]),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise CorruptHeaderError(path, f"header lacks a required field ({e})") from e


def pack_preamble(header_len: int, data_offset: int, header_sha256: bytes) -> bytes:
    raw = PREAMBLE.pack(MAGIC, VERSION, 0, header_len, data_offset, header_sha256)
    return raw.ljust(PREAMBLE_SIZE, b"\0")


@dataclass(frozen=True)
class Preamble:
    version: int
    header_len: int
    data_offset: int
    header_sha256: bytes


def unpack_preamble(path: str | Path, raw: bytes, file_size: int) -> Preamble:
    if len(raw) < 8 or raw[:8] != MAGIC:
        raise BadMagicError(path, "not a .ninfer artifact (wrong magic bytes)")
    if len(raw) < PREAMBLE.size:
        raise TruncatedError(path, f"file ends inside the preamble ({file_size} bytes)")
    magic, version, _flags, header_len, data_offset, sha = PREAMBLE.unpack_from(raw)
    if version != VERSION:
        raise UnsupportedVersionError(
            path,
            f"artifact format version {version} is not supported (this ninfer reads {VERSION})",
        )
    if PREAMBLE_SIZE + header_len > file_size:
        raise TruncatedError(
            path, f"file ends inside the header ({file_size} bytes, header needs {header_len})"
        )
    if data_offset < PREAMBLE_SIZE + header_len or data_offset % DATA_ALIGNMENT:
        raise CorruptHeaderError(path, f"invalid data offset {data_offset}")
    return Preamble(version, header_len, data_offset, sha)


def sha256(raw: bytes) -> bytes:
    return hashlib.sha256(raw).digest()
