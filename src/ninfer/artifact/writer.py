"""Streaming `.ninfer` writer.

The tensor table (names, dtypes, shapes) is fixed before any data is written, so every offset is
known up front and tensors can be streamed one at a time in any order: a 54 GB model converts with
one tensor in memory. Checksums are filled in at the end; they are fixed-width hex, so the header
keeps its length and the data never moves. The file appears under its final name only when complete:
each writer streams into a partial file of its own (`OUT.<random>.partial` beside OUT), so two
writers of one path (two commands building the demo on first use at once) never write into each
other's bytes; the last to finish replaces the other's complete file with its own.
"""

from __future__ import annotations

import os
import secrets
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import torch

from ninfer.artifact.errors import ArtifactError
from ninfer.artifact.format import (
    DATA_ALIGNMENT,
    DTYPES,
    PREAMBLE_SIZE,
    TENSOR_ALIGNMENT,
    Header,
    TensorEntry,
    align,
    pack_preamble,
    sha256,
)

TORCH_TO_DTYPE = {getattr(torch, tname): key for key, (_, tname) in DTYPES.items()}


@dataclass(frozen=True)
class TensorPlan:
    """A tensor the writer will receive: everything but its bytes."""

    name: str
    component: str
    dtype: str
    shape: tuple[int, ...]
    format: str = "plain"
    scale: str | None = None


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """Raw little-endian bytes of a CPU tensor without an extra copy when it is contiguous."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


class ArtifactWriter:
    """Write one artifact. Use as a context manager; `write()` each planned tensor exactly once."""

    def __init__(self, path: str | Path, header: Header, plan: list[TensorPlan]) -> None:
        self.path = Path(path)
        self.header = header
        entries: dict[str, TensorEntry] = {}
        offset = 0
        for p in plan:
            if p.name in entries:
                raise ArtifactError(self.path, f"tensor {p.name!r} planned twice")
            itemsize = DTYPES[p.dtype][0]
            nbytes = itemsize
            for d in p.shape:
                nbytes *= d
            offset = align(offset, TENSOR_ALIGNMENT)
            entries[p.name] = TensorEntry(
                p.name, p.component, p.dtype, tuple(p.shape), offset, nbytes, p.format, p.scale
            )
            offset += nbytes
        header.tensors = entries
        header.data_size = align(offset, TENSOR_ALIGNMENT)
        self._header_len = len(header.to_json_bytes())
        self._data_offset = align(PREAMBLE_SIZE + self._header_len, DATA_ALIGNMENT)
        self._crcs: dict[str, str] = {}
        try:
            self._tmp, self._file = _create_partial(self.path)  # closed in close() / abort()
        except OSError as e:
            raise ArtifactError(self.path, f"cannot write the artifact: {_why(e)}") from e
        try:
            self._file.truncate(self._data_offset + header.data_size)
        except BaseException as e:
            self.abort()
            if isinstance(e, OSError):
                raise ArtifactError(self.path, f"cannot write the artifact: {_why(e)}") from e
            raise

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write(self, name: str, tensor: torch.Tensor) -> None:
        entry = self.header.tensors.get(name)
        if entry is None:
            raise ArtifactError(self.path, f"tensor {name!r} was not planned")
        if name in self._crcs:
            raise ArtifactError(self.path, f"tensor {name!r} written twice")
        got = TORCH_TO_DTYPE.get(tensor.dtype)
        if got != entry.dtype or tuple(tensor.shape) != entry.shape:
            raise ArtifactError(
                self.path,
                f"tensor {name!r} is {got} {tuple(tensor.shape)}, "
                f"planned {entry.dtype} {entry.shape}",
            )
        data = tensor_bytes(tensor)
        assert data.nbytes == entry.nbytes
        try:
            self._file.seek(self._data_offset + entry.offset)
            self._file.write(data)
        except OSError as e:  # e.g. a full disk; the caller's `with` removes the partial file
            raise ArtifactError(self.path, f"cannot write the artifact: {_why(e)}") from e
        self._crcs[name] = f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"

    def close(self) -> Path:
        missing = [n for n in self.header.tensors if n not in self._crcs]
        if missing:
            self.abort()
            raise ArtifactError(
                self.path, f"{len(missing)} planned tensors never written: {missing[0]}"
            )
        self.header.tensors = {
            n: replace(e, crc32=self._crcs[n]) for n, e in self.header.tensors.items()
        }
        raw = self.header.to_json_bytes()
        assert len(raw) == self._header_len, "header length changed while filling checksums"
        try:
            self._file.seek(0)
            self._file.write(pack_preamble(len(raw), self._data_offset, sha256(raw)))
            self._file.write(raw)
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._tmp, self.path)
        except BaseException as e:  # a full disk or an unwritable destination: no partial file
            self.abort()
            if isinstance(e, OSError):
                raise ArtifactError(self.path, f"cannot write the artifact: {_why(e)}") from e
            raise
        return self.path

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)


def _create_partial(path: Path) -> tuple[Path, BinaryIO]:
    """A new file `path.<random>.partial` beside `path`, open for writing: this writer's alone
    (exclusive creation), with the permissions of a plain open (0666 less the umask)."""
    while True:
        tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.partial")
        try:
            return tmp, open(tmp, "xb+")  # noqa: SIM115  (the writer closes it)
        except FileExistsError:
            continue


def _why(e: OSError) -> str:
    """The OS's reason in lower case, without the errno and path Python prefixes."""
    return (e.strerror or str(e)).lower()
