"""A package is untrusted input: damaged or inconsistent files raise PackageError,
naming what is wrong, and never crash or hang the process."""
import copy
import hashlib
import random
import struct
import time

import msgpack
import numpy as np
import pytest

from meganeura.compiler import Builder, TrainConfig, compile_model
from meganeura.runtime import Package, PackageError, Session
from meganeura.runtime.package import MAGIC


@pytest.fixture(scope="module")
def good() -> bytes:
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (8, 12))
    h = b.relu(b.linear(x, b.param("fc1.weight", rng.standard_normal((16, 12))), b.param("fc1.bias", np.zeros(16))))
    b.output("logits", b.linear(h, b.param("fc2.weight", rng.standard_normal((5, 16))), b.param("fc2.bias", np.zeros(5))))
    return compile_model(b.build(), TrainConfig(optimizer="adamw", lr=0.01))


def split(data: bytes):
    man_len = struct.unpack_from("<Q", data, 12)[0]
    manifest = msgpack.unpackb(data[20:20 + man_len], raw=False)
    blob_len = struct.unpack_from("<Q", data, 20 + man_len)[0]
    blob = data[28 + man_len:28 + man_len + blob_len]
    return manifest, blob


def seal(manifest: dict, blob: bytes) -> bytes:
    """Re-pack with valid lengths and checksums, so only the validator can catch the damage."""
    for k in manifest.get("kernels", []) if isinstance(manifest.get("kernels"), list) else []:
        if isinstance(k, dict) and isinstance(k.get("wgsl"), str):
            k["sha256"] = hashlib.sha256(k["wgsl"].encode()).hexdigest()
    man = msgpack.packb(manifest, use_bin_type=True)
    head = MAGIC + struct.pack("<IQ", 1, len(man)) + man + struct.pack("<Q", len(blob))
    return head + blob + hashlib.sha256(head).digest()  # the blob is covered by blob_sha256


def test_good_package_loads_and_reseals(good):
    assert Package.from_bytes(good).manifest["format_version"] == 1
    m, blob = split(good)
    assert seal(m, blob) == good


def _manifest_mutations(m: dict, rng: random.Random):
    """Yield (description, mutated manifest): each one breaks a rule the validator checks."""
    nbuf, nker, nten = len(m["buffers"]), len(m["kernels"]), len(m["tensors"])
    bad_ints = [-1, 1 << 50, "7", 2.5, None, True]
    progs = list(m["programs"])
    for _ in range(60):
        p = rng.choice(progs)
        j = rng.randrange(len(m["programs"][p]["dispatches"]))
        mm = copy.deepcopy(m)
        d = mm["programs"][p]["dispatches"][j]
        choice = rng.randrange(8)
        if choice == 0:
            d["kernel"] = rng.choice([nker, nker + rng.randrange(1, 1000), -1, "0", None])
        elif choice == 1:
            d["buffers"][rng.randrange(len(d["buffers"]))] = rng.choice([nbuf, nbuf + 5, -3, 1.5, "x"])
        elif choice == 2:
            d["buffers"] = d["buffers"][:-1]
        elif choice == 3:
            d["buffers"] = d["buffers"] + [0]
        elif choice == 4:
            d["workgroups"] = rng.choice([[1, 1], [1, 1, 1, 1], [-1, 1, 1], [1 << 40, 1, 1], "abc"])
        elif choice == 5:
            del d[rng.choice(["kernel", "buffers", "workgroups"])]
        elif choice == 6:
            writes = [i for i, a in enumerate(mm["kernels"][d["kernel"]]["access"]) if a == "read_write"]
            reads = [i for i, a in enumerate(mm["kernels"][d["kernel"]]["access"]) if a == "read"]
            if not reads:
                continue
            d["buffers"][rng.choice(reads)] = d["buffers"][writes[0]]  # read and write one buffer
        else:
            mm["programs"][p]["dispatches"][j] = rng.choice([[], 3, "dispatch", None])
        yield f"dispatch {choice}", mm
    for _ in range(40):
        mm = copy.deepcopy(m)
        i = rng.randrange(nten)
        t = mm["tensors"][i]
        choice = rng.randrange(7)
        if choice == 0:
            t["buffer"] = rng.choice([nbuf, nbuf + 9, -1] + bad_ints)
        elif choice == 1:
            t["shape"] = [int(d) * 1000 + 1000 for d in t["shape"]] or [1 << 30]  # larger than its buffer
        elif choice == 2:
            t["role"] = rng.choice(["weights", "", 3, None])
        elif choice == 3:
            t["dtype"] = rng.choice(["f64", "int8", 1, None])
        elif choice == 4:
            t["shape"] = rng.choice([[-1], ["3"], [1.5], "3x3", [1] * 9])
        elif choice == 5:
            del t[rng.choice(["name", "role", "dtype", "shape", "buffer"])]
        else:
            t["init"] = "random" if t["role"] != "output" else t.get("init")
            if t["role"] == "output":
                del t["program"]
        yield f"tensor {choice}", mm
    for _ in range(40):
        mm = copy.deepcopy(m)
        choice = rng.randrange(9)
        if choice == 0:
            mm["buffers"][rng.randrange(nbuf)] = rng.choice([0, -16, 3, 1 << 50, "16", None])
        elif choice == 1:
            k = mm["kernels"][rng.randrange(nker)]
            k["access"][0] = rng.choice(["write", "rw", 0, None])
        elif choice == 2:
            k = mm["kernels"][rng.randrange(nker)]
            k["workgroup_size"] = rng.choice([[0, 1, 1], [2048, 1, 1], [64, 1], "64"])
        elif choice == 3:
            p = mm["programs"][rng.choice(progs)]
            name = rng.choice(list(p["outputs"]) or ["loss"])
            p["outputs"][name] = rng.choice([nten, -1, "0", 0 if p["outputs"].get(name) != 0 else 1])
        elif choice == 4:
            p = mm["programs"][rng.choice(progs)]
            name = rng.choice(list(p["inputs"]))
            p["inputs"][name] = rng.choice([nten, nten + 100, -5, None])
        elif choice == 5:
            del mm[rng.choice(["format", "format_version", "buffers", "tensors", "kernels", "programs",
                               "blob_sha256", "requires", "memory"])]
        elif choice == 6:
            mm[rng.choice(["buffers", "tensors", "kernels", "programs"])] = rng.choice([None, 7, "x", {}])
            if isinstance(mm.get("programs"), dict) and not mm["programs"]:
                pass  # an empty program map lacks "infer": also invalid
        elif choice == 7:
            mm["format_version"] = rng.choice([0, 2, "1", None])
        else:
            mm["blob_sha256"] = "0" * 64
        yield f"manifest {choice}", mm


def test_a_thousand_mutated_packages_raise_package_error(good):
    rng = random.Random(1234)
    m, blob = split(good)
    cases = []
    # damaged bytes: truncation, bit flips, appended junk (checksums and lengths catch these)
    for _ in range(300):
        n = rng.randrange(len(good))
        cases.append(("truncated", good[:n]))
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        cases.append(("bit flip", bytes(data)))
    cases.append(("appended", good + b"\0"))
    cases.append(("empty", b""))
    cases.append(("not msgpack", seal({}, b"")[:20] + b"\xc1" * 10))
    # well-sealed files whose manifest breaks the rules: only the validator stands in the way
    while len(cases) < 1100:
        for what, mm in _manifest_mutations(m, rng):
            cases.append((what, seal(mm, blob)))
    # weights that do not match the manifest
    wrong = m | {"blob_sha256": hashlib.sha256(b"junk").hexdigest()}
    cases.append(("bad blob", seal(wrong, b"junk")))
    assert len(cases) >= 1000
    start = time.perf_counter()
    for what, data in cases:
        t = time.perf_counter()
        try:
            Package.from_bytes(data)
        except PackageError as exc:
            assert str(exc), what
        else:
            pytest.fail(f"{what}: a damaged package loaded without PackageError")
        assert time.perf_counter() - t < 1.0, f"{what}: validation took too long"
    assert time.perf_counter() - start < 60


def test_wgsl_rejected_by_the_compiler_is_a_package_error(good, device):
    m, blob = split(good)
    for k in m["kernels"]:  # every kernel, whichever variants this device picks
        k["wgsl"] = k["wgsl"].replace("fn main", "fn main(", 1)
    pkg = Package.from_bytes(seal(m, blob))  # the manifest is consistent; the WGSL is not
    with pytest.raises(PackageError, match=r"kernel \d+ .* rejected by the WGSL compiler"):
        Session(device, pkg)


def test_missing_file_and_wrong_magic(tmp_path):
    with pytest.raises(PackageError, match="cannot read"):
        Package.load(tmp_path / "nope.mnpk")
    (tmp_path / "x.mnpk").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(PackageError, match="magic"):
        Package.load(tmp_path / "x.mnpk")
