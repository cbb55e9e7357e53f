"""store4: a GEMM kernel's results for 4 neighbouring columns (n0 .. n0 + 3) in one call.

Each thread holds its results as vec4s of 4 neighbouring columns. Storing them through
store() one value at a time repeats the epilogue's index arithmetic (divisions to find a
channel, a pixel) and its per-channel reads 4 times over: the driver cannot tell that
n0 + 1 lies in the same channel as n0. Where the columns come in whole groups of 4
(N % 4 == 0, so n0 % 4 == 0 and the group never straddles an edge), store4 computes what
the 4 share once (lines that divide the flat index or n by a multiple of 4, and what depends
only on them) and the rest per column in a block of its own: faster kernels, and half the
driver's compile time of an epilogue (bench/REJECTED.md: results stored one at a time).
Everything else falls back to 4 store() calls.
"""
from __future__ import annotations

import re

_LET = re.compile(r"let (\w+)(?:: [\w<>]+)? = (.+);")
_WRITE = re.compile(r"\w+\[.+\] = .+;")
# a coordinate that 4 neighbouring columns share: (x / S) % D or x / S with S a multiple of 4
_SHARED_SPLIT = re.compile(r"\(?(?:idx|n) / (\d+)u\)?(?: % \d+u)?")
_INDEX = re.compile(r"(?:\w+ \* \d+u \+ )*n")  # idx = g * X + m * Y + n: X, Y multiples of 4
_NAME = re.compile(r"[A-Za-z_]\w*")


def _fallback() -> str:
    return "\n".join(f"    store(g, slice, m, n0 + {i}u, v4.{c});" for i, c in enumerate("xyzw"))


def store4_body(store: str, n: int) -> str:
    """WGSL body of store4(g, slice, m, n0, v4) from the body of store(g, slice, m, n, v),
    for a GEMM with `n` columns."""
    lines = [line.strip() for line in store.splitlines() if line.strip()]
    if n % 4 or not lines:
        return _fallback()
    varying, shared, per_column = {"n", "v"}, [], []
    for line in lines:
        let = _LET.fullmatch(line)
        if let is None:
            if not _WRITE.fullmatch(line):
                return _fallback()  # control flow or anything unforeseen: one value at a time
            per_column.append(line)
            continue
        name, rhs = let.groups()
        if name == "idx":
            if not _INDEX.fullmatch(rhs) or any(int(c) % 4 for c in re.findall(r"(\d+)u", rhs)):
                return _fallback()  # (idx % 4 == n % 4 needs every other term a multiple of 4)
            varying.add(name)
            per_column.append(line)
            continue
        split = _SHARED_SPLIT.fullmatch(rhs)
        if split is not None and int(split.group(1)) % 4 == 0:
            shared.append(line)
        elif set(_NAME.findall(rhs)) & varying:
            varying.add(name)
            per_column.append(line)
        else:
            shared.append(line)
    uses_idx = any(re.search(r"\bidx\b", line) for line in shared)
    if uses_idx:  # the shared lines read the first column's flat index
        idx_line = next(line for line in lines if line.startswith("let idx ="))
        shared.insert(0, idx_line.replace("let idx =", "let idx0 =").replace(" n;", " n0;"))
    out = [f"    {_at_first(line)}" for line in shared]
    for i, c in enumerate("xyzw"):
        out += ["    {", f"        let n = n0 + {i}u;", f"        let v = v4.{c};"]
        out += [f"        {line}" for line in per_column] + ["    }"]
    return "\n".join(out)


def _at_first(line: str) -> str:
    """A shared line reading the first column's n and flat index."""
    return re.sub(r"\bidx\b", "idx0", re.sub(r"\bn\b", "n0", line))
