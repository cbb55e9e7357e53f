"""How much workgroup memory a kernel declares, read from its WGSL (wgpu 0.32 does not
check it when it makes a pipeline, so the Session does, before any GPU object)."""
from __future__ import annotations

import re

from .errors import PackageError

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_ADDRESS_SPACE = re.compile(r"workgroup(?!\w)")  # (a literal first: a fast scan of long kernels)
_DECLARED = re.compile(r"\s*>\s*\w+\s*:\s*([^;]*);")  # after `var<workgroup`: the variable and its type
_ARRAY = re.compile(r"array\s*<\s*(.+?)\s*,\s*(0[xX][0-9a-fA-F]+|\d+)[iu]?\s*>")
_VECTOR = re.compile(r"vec([234])\s*(?:<\s*([fiu]32|f16)\s*>|([fiuh]))")
_SCALAR_BYTES = {"f32": 4, "i32": 4, "u32": 4, "f16": 2, "f": 4, "i": 4, "u": 4, "h": 2}


def workgroup_bytes(wgsl: str):
    """Bytes of workgroup memory a kernel declares, as WebGPU counts them (each variable rounded
    up to 16), or None when a declaration is of a type this does not size (scalars, vectors and
    arrays of them or of such arrays, with literal lengths, are sized; the compiler emits only those)."""
    code = _COMMENTS.sub(" ", wgsl)
    total = 0
    for m in _ADDRESS_SPACE.finditer(code):
        if _word_before(code, m.start()) != "<":
            continue  # part of a longer name, or not an address space
        # `var<workgroup> x: T;` declares memory; `ptr<workgroup, T>` points into it
        owner = _word_before(code, _skip_back(code, m.start()) - 1)
        if owner == "ptr":
            continue
        decl = _DECLARED.match(code, m.end()) if owner == "var" else None
        size = _type_bytes(decl.group(1).strip()) if decl else None
        if size is None:
            return None
        total += -(-size // 16) * 16
    return total


def _skip_back(code: str, i: int) -> int:
    """The index just after the last non-space character before `i`."""
    while i > 0 and code[i - 1].isspace():
        i -= 1
    return i


def _word_before(code: str, i: int):
    """The token that ends just before `i` (spaces skipped): an identifier, or one character."""
    j = _skip_back(code, i)
    if j == 0:
        return None
    k = j
    while k > 0 and (code[k - 1].isalnum() or code[k - 1] == "_"):
        k -= 1
    return code[k:j] if k < j else code[j - 1]


def _type_bytes(ty: str):
    sized = _size_align(ty)
    return sized[0] if sized else None


def _size_align(ty: str):
    """(bytes, alignment) of a WGSL type as WGSL lays it out (an array's elements a stride
    apart: their size rounded up to their alignment, 16 for a vec3<f32>), or None."""
    array = _ARRAY.fullmatch(ty)
    if array:  # (arrays of arrays too: the non-greedy element widens until the whole type matches)
        inner = _size_align(array.group(1).strip())
        if inner is None:
            return None
        size, align = inner
        return int(array.group(2), 0) * (-(-size // align) * align), align
    vector = _VECTOR.fullmatch(ty)
    if vector:
        n, item = int(vector.group(1)), _SCALAR_BYTES[vector.group(2) or vector.group(3)]
        return n * item, item * (4 if n == 3 else n)
    if ty in _SCALAR_BYTES and len(ty) == 3:
        return _SCALAR_BYTES[ty], _SCALAR_BYTES[ty]
    return None


def check_workgroup_memory(kernels, used, shared: int) -> None:
    """The kernels `used` (indices into `kernels`, KernelInfo records) against `shared`, the
    device's workgroup memory, before any GPU object: wgpu 0.32 does not check it when it makes a
    pipeline (WebGPU's default limit is 16 KiB; GEMM tiles take 16, fused attention up to 32).
    PackageError names the first too big."""
    for i in sorted(used):
        label = kernels[i].label[:60]
        need = workgroup_bytes(kernels[i].wgsl)
        if need is None:
            raise PackageError(f"kernel {i} ({label}) declares workgroup memory of a type the runtime cannot "
                               "size, so it cannot check it against the device")
        if need > shared:
            raise PackageError(
                f"kernel {i} ({label}) uses {need} bytes of workgroup memory; this device allows {shared}. "
                "If the adapter allows more, make the device with required_limits="
                "{'max-compute-workgroup-storage-size': adapter.limits['max-compute-workgroup-storage-size']}")
