"""Just enough ELF64 to read a cubin: section sizes, function sizes, and the
initial bytes of a device global (what the build reads back from the kernel)."""
from __future__ import annotations

import struct
from dataclasses import dataclass


class ElfError(ValueError):
    """Bytes that are not the little-endian ELF64 this reader understands."""


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int


@dataclass(frozen=True)
class Symbol:
    name: str
    kind: int  # STT_*: 1 object, 2 function
    section: int
    value: int
    size: int


STT_OBJECT = 1
STT_FUNC = 2
SHT_NOBITS = 8


class Elf:
    def __init__(self, data: bytes) -> None:
        if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ElfError("not a little-endian ELF64 image")
        self.data = data
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        if shentsize != 64 or shoff + shnum * 64 > len(data):
            raise ElfError("truncated or unusual section header table")
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * 64) for i in range(shnum)]
        names = raw[shstrndx]
        self.sections = [Section(self._str(names[4], h[0]), h[1], h[4], h[5]) for h in raw]
        self.symbols: list[Symbol] = []
        for h in raw:
            if h[1] != 2:  # SHT_SYMTAB
                continue
            strtab = raw[h[6]][4]
            for off in range(h[4], h[4] + h[5], 24):
                st_name, st_info, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", data, off)
                self.symbols.append(Symbol(self._str(strtab, st_name), st_info & 0xF, st_shndx, st_value, st_size))

    def _str(self, table_off: int, idx: int) -> str:
        end = self.data.index(b"\0", table_off + idx)
        return self.data[table_off + idx : end].decode("ascii", "replace")

    def symbol(self, name: str) -> Symbol:
        for s in self.symbols:
            if s.name == name:
                return s
        raise ElfError(f"no symbol '{name}' in the image")

    def read(self, name: str) -> bytes:
        """Initial contents of a device global."""
        s = self.symbol(name)
        sec = self.sections[s.section]
        if sec.type == SHT_NOBITS:
            raise ElfError(f"'{name}' has no initial value in the image")
        return self.data[sec.offset + s.value : sec.offset + s.value + s.size]

    def functions(self) -> dict[str, int]:
        """Code bytes of every function in the image."""
        return {s.name: s.size for s in self.symbols if s.kind == STT_FUNC}

    def code_bytes(self) -> int:
        """All executable code (.text.* sections)."""
        return sum(s.size for s in self.sections if s.name.startswith(".text"))
