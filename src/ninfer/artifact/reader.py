"""`.ninfer` reader: validate on open, then hand out zero-copy tensors from a private mmap.

Opening reads only the preamble and header and checks everything that can be checked without
touching tensor data (magic, version, header checksum, tensor ranges, scale links, required tensors
and their shapes for the components present). Tensor bytes are mapped copy-on-write, so a view is
zero-copy and writable without ever changing the file; only the components asked for are paged in,
and each tensor's CRC is checked the first time it is read unless `verify=False`.
"""

from __future__ import annotations

import mmap
import os
import stat
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from ninfer.artifact import schema
from ninfer.artifact.errors import (
    ChecksumError,
    CorruptHeaderError,
    MissingComponentError,
    MissingTensorError,
    ShapeMismatchError,
    TensorRangeError,
    TruncatedError,
)
from ninfer.artifact.format import (
    DTYPES,
    FP8_BLOCK,
    PREAMBLE_SIZE,
    Header,
    TensorEntry,
    sha256,
    unpack_preamble,
)

LoadProgress = Callable[[str, int, int], None]  # (tensor name, bytes done, bytes total)


class Artifact:
    """An open `.ninfer` file. Cheap to open; tensors are materialised on demand.

    `progress`, when given, is called after each tensor `load()` hands out (checksum checked):
    reading and checking the bytes is most of a large model's load time.
    """

    def __init__(self, path: str | Path, *, progress: LoadProgress | None = None) -> None:
        self.path = Path(path)
        self.progress = progress
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError as e:
            raise MissingComponentError(self.path, "no such artifact file") from e
        except IsADirectoryError as e:
            raise MissingComponentError(self.path, "is a directory, not an artifact file") from e
        except PermissionError as e:
            raise MissingComponentError(self.path, "permission denied") from e
        try:
            st = os.fstat(self._fd)
            if stat.S_ISDIR(st.st_mode):  # Linux opens a directory read-only without complaint
                raise MissingComponentError(self.path, "is a directory, not an artifact file")
            self.file_size = st.st_size
            raw = os.pread(self._fd, PREAMBLE_SIZE, 0)
            self.preamble = unpack_preamble(self.path, raw, self.file_size)
            header_raw = os.pread(self._fd, self.preamble.header_len, PREAMBLE_SIZE)
            if sha256(header_raw) != self.preamble.header_sha256:
                raise ChecksumError(self.path, "header checksum mismatch (the header was altered)")
            self.header = Header.from_json_bytes(self.path, header_raw)
            self._check_table()
            for component in self.header.components:
                self._check_component(component)
        except BaseException:
            os.close(self._fd)
            raise
        self._mmap: mmap.mmap | None = None
        self._verified: set[str] = set()

    # -- header-level accessors -------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, Any]:
        return self.header.metadata

    @property
    def config(self) -> dict[str, Any]:
        return self.header.config

    @property
    def components(self) -> list[str]:
        return self.header.components

    @property
    def name(self) -> str:
        return str(self.metadata.get("name") or self.metadata.get("architecture") or "unknown")

    @property
    def tokenizer_json(self) -> str:
        return str(self.header.tokenizer["json"])

    def chat_template(self, name: str | None = None) -> str:
        key = name or self.header.default_chat_template
        try:
            return self.header.chat_templates[key]
        except KeyError:
            raise MissingComponentError(self.path, f"no chat template named {key!r}") from None

    def entries(self, component: str | None = None) -> list[TensorEntry]:
        return [
            e for e in self.header.tensors.values() if component is None or e.component == component
        ]

    # -- validation ---------------------------------------------------------------------------
    def _check_table(self) -> None:
        data_size = self.header.data_size
        if self.preamble.data_offset + data_size > self.file_size:
            raise TruncatedError(
                self.path,
                f"file is truncated: {self.file_size} bytes, the tensor data needs "
                f"{self.preamble.data_offset + data_size}",
            )
        for e in self.header.tensors.values():
            expected = DTYPES[e.dtype][0] * e.numel
            if e.nbytes != expected:
                raise TensorRangeError(
                    self.path,
                    f"tensor {e.name!r} claims {e.nbytes} bytes, its shape needs {expected}",
                )
            if e.offset < 0 or e.offset + e.nbytes > data_size:
                raise TensorRangeError(
                    self.path,
                    f"tensor {e.name!r} [{e.offset}, {e.offset + e.nbytes}) lies outside the "
                    f"data section ({data_size} bytes)",
                )
            if e.format == "fp8_block128":
                self._check_scale(e)

    def _check_scale(self, e: TensorEntry) -> None:
        scale = self.header.tensors.get(e.scale or "")
        if scale is None:
            raise MissingTensorError(self.path, f"fp8 tensor {e.name!r} lacks its scale tensor")
        blocks = tuple(-(-d // FP8_BLOCK) for d in e.shape[-2:])
        want = (*e.shape[:-2], *blocks)
        if scale.shape != want or scale.dtype != "f32":
            raise ShapeMismatchError(
                self.path,
                f"scale {scale.name!r} is {scale.dtype} {scale.shape}, expected f32 {want}",
            )

    def _check_component(self, component: str) -> None:
        try:
            required = schema.component_tensors(self.config, component)
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptHeaderError(self.path, f"{component} config is incomplete ({e})") from e
        for rel, shape in required.items():
            e = self.header.tensors.get(f"{component}.{rel}")
            if e is None:
                raise MissingTensorError(self.path, f"required tensor {component}.{rel} is missing")
            if e.shape != shape:
                raise ShapeMismatchError(
                    self.path,
                    f"tensor {e.name} has shape {list(e.shape)}, the config implies {list(shape)}",
                )

    # -- tensor access ------------------------------------------------------------------------
    def _map(self) -> mmap.mmap:
        if self._mmap is None:
            self._mmap = mmap.mmap(self._fd, 0, access=mmap.ACCESS_COPY)
        return self._mmap

    def tensor(self, name: str, *, verify: bool = True) -> torch.Tensor:
        """A zero-copy view of one stored tensor (its stored dtype; fp8 stays fp8)."""
        e = self.header.tensors.get(name)
        if e is None:
            raise MissingTensorError(self.path, f"no tensor named {name!r}")
        start = self.preamble.data_offset + e.offset
        if verify and name not in self._verified:
            view = memoryview(self._map())[start : start + e.nbytes]
            crc = f"{zlib.crc32(view) & 0xFFFFFFFF:08x}"
            view.release()
            if crc != e.crc32:
                raise ChecksumError(
                    self.path, f"tensor {name!r} fails its checksum (data corrupted)"
                )
            self._verified.add(name)
        dtype = getattr(torch, DTYPES[e.dtype][1])
        if e.nbytes == 0:
            return torch.empty(e.shape, dtype=dtype)
        flat = torch.frombuffer(self._map(), dtype=torch.uint8, count=e.nbytes, offset=start)
        return flat.view(dtype).view(e.shape)

    def load(self, component: str = "text", *, verify: bool = True) -> dict[str, torch.Tensor]:
        """All tensors of one component, keyed by their name relative to the component."""
        if component not in self.components:
            raise MissingComponentError(
                self.path, f"artifact has no {component!r} component (has {self.components})"
            )
        prefix = f"{component}."
        entries = self.entries(component)
        total = sum(e.nbytes for e in entries)
        done = 0
        out = {}
        for e in entries:
            out[e.name[len(prefix) :]] = self.tensor(e.name, verify=verify)
            done += e.nbytes
            if self.progress is not None:
                self.progress(e.name, done, total)
        return out

    def verify(self, components: Iterable[str] | None = None) -> None:
        """Check the CRC of every tensor of the given components (all when None)."""
        wanted = set(components) if components is not None else None
        for e in self.header.tensors.values():
            if wanted is None or e.component in wanted:
                self.tensor(e.name, verify=True)

    def close(self) -> None:
        # NOTE: never mmap.close() here: tensors handed out are zero-copy views that keep the map
        # object alive, and unmapping under them would turn a later read into a segfault. Dropping
        # our reference unmaps the file once the last view is gone.
        self._mmap = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Artifact:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_artifact(path: str | Path) -> Artifact:
    return Artifact(path)
