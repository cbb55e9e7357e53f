"""A package is untrusted input: damaged or inconsistent files raise PackageError,
naming what is wrong, and never crash or hang the process."""
import copy
import hashlib
import json
import random
import struct
import time
import zlib

import msgpack
import numpy as np
import pytest
from meganeura.compiler import Builder, TrainConfig, compile_model
from meganeura.runtime import GPUOutOfMemoryError, Package, PackageError, Session
from meganeura.runtime.package import FORMAT_VERSION, MAGIC


@pytest.fixture(scope="module")
def good(mlp_training_bytes) -> bytes:
    return mlp_training_bytes


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
    head = MAGIC + struct.pack("<IQ", FORMAT_VERSION, len(man)) + man + struct.pack("<Q", len(blob))
    return head + blob + hashlib.sha256(head).digest()  # the blob is covered by blob_checksum


def test_good_package_loads_and_reseals(good):
    assert Package.from_bytes(good).manifest["format_version"] == FORMAT_VERSION
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
    yield from _range_mutations(m, rng)
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
                               "blob_checksum", "requires", "memory"])]
        elif choice == 6:
            mm[rng.choice(["buffers", "tensors", "kernels", "programs"])] = rng.choice([None, 7, "x", {}])
            if isinstance(mm.get("programs"), dict) and not mm["programs"]:
                pass  # an empty program map lacks "infer": also invalid
        elif choice == 7:
            mm["format_version"] = rng.choice([0, 1, FORMAT_VERSION + 1, str(FORMAT_VERSION), None])
        else:
            ck = mm["blob_checksum"]
            k = rng.choice(["algorithm", "chunk_bytes", "values", "values", "drop"])
            if k == "drop":
                del ck[rng.choice(list(ck))]
            else:
                ck[k] = {"algorithm": rng.choice(["sha256", "", None]), "chunk_bytes": rng.choice([0, 7, -1, 1 << 40]),
                         "values": rng.choice([b"", b"\0" * len(ck["values"]), ck["values"] + b"\0" * 4, "x"])}[k]
        yield f"manifest {choice}", mm


def _range_mutations(m: dict, rng: random.Random):
    """Tensors at offsets in shared buffers and dispatches binding ranges (the arenas of
    parameters, optimizer state and gradients): each mutation breaks one rule."""
    ranged = [(p, j) for p, q in m["programs"].items() for j, d in enumerate(q["dispatches"]) if d.get("ranges")]
    placed = [i for i, t in enumerate(m["tensors"]) if t.get("offset")]
    inputs = [i for i, t in enumerate(m["tensors"]) if t["role"] == "input"]
    assert ranged and placed, "the fuzzed package should place tensors in arenas"
    def written_twice(d):  # binding pairs writing one buffer (gradients of one arena)
        access = m["kernels"][d["kernel"]]["access"]
        rw = [k for k, a in enumerate(access) if a == "read_write"]
        return [(a, b) for a in rw for b in rw if a < b and d["buffers"][a] == d["buffers"][b]]
    twice = [(p, j) for p, j in ranged if written_twice(m["programs"][p]["dispatches"][j])]
    for _ in range(40):
        mm = copy.deepcopy(m)
        choice = rng.randrange(7)
        p, j = rng.choice(twice if choice == 3 and twice else ranged)
        d = mm["programs"][p]["dispatches"][j]
        b = next(i for i, r in enumerate(d["ranges"]) if r)
        size = mm["buffers"][d["buffers"][b]]
        if choice == 0:
            d["ranges"][b] = rng.choice([[1, 16], [0, 0], [0, 3], [256], "x", [0, 1 << 50], [-256, 16], [0, size + 4]])
        elif choice == 1:
            d["ranges"] = d["ranges"][:-1]
        elif choice == 2:
            d["ranges"][b] = [-(-size // 256) * 256, 16]  # past the buffer's end
        elif choice == 3 and twice:  # two gradients written at overlapping ranges
            a, c = rng.choice(written_twice(d))
            d["ranges"][c] = [d["ranges"][a][0], d["ranges"][c][1] + 256]
        elif choice == 3:  # a range read from a buffer the dispatch writes
            access = mm["kernels"][d["kernel"]]["access"]
            w = [k for k, a in enumerate(access) if a == "read_write"]
            r = [k for k, a in enumerate(access) if a == "read"]
            if not (w and r):
                continue
            d["buffers"][r[0]], d["ranges"][r[0]] = d["buffers"][w[0]], [0, 16]
        elif choice == 4:
            t = mm["tensors"][rng.choice(placed)]
            t["offset"] = rng.choice([1, 4, 128, -256, 1 << 50, "256", None, mm["buffers"][t["buffer"]]])
        elif choice == 5:
            mm["tensors"][rng.choice(inputs)]["offset"] = 256
        elif choice == 6 and rng.random() < 0.5:  # a variant rebinding what the checked dispatch binds
            d.setdefault("variants", {})["cpu"] = {"kernel": d["kernel"], "workgroups": d["workgroups"],
                                                   "ranges": [[0, 4]] * len(d["buffers"])}
        else:
            d["ranges"] = rng.choice([{}, "ranges", [None] * (len(d["buffers"]) + 1)])
        yield f"range {choice}", mm


OTHER_TYPES = [None, True, False, 0, -1, 1 << 40, 2**63, 3.5, float("nan"), "", "x" * 9, b"\x00\xff",
               [], [1, "a"], {}, {"a": 1}]


def _paths(obj, prefix=()):
    """Every path to a value inside the manifest (dict keys and list indices)."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list):
        items = enumerate(obj)
    else:
        return
    for k, v in items:
        yield prefix + (k,)
        yield from _paths(v, prefix + (k,))


def _set(obj, path, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def _get(obj, path):
    for k in path:
        obj = obj[k]
    return obj


def _type_confusion(m: dict, rng: random.Random, count: int):
    """msgpack type confusion: one value anywhere in the manifest gets another type."""
    paths = list(_paths(m))
    for _ in range(count):
        path = rng.choice(paths)
        old = _get(m, path)
        value = rng.choice([v for v in OTHER_TYPES if type(v) is not type(old)])
        mm = copy.deepcopy(m)
        _set(mm, path, value)
        yield f"type confusion at {'.'.join(map(str, path))}", mm


# what the runtime reads from a manifest; other fields (source, timings) are metadata
SEMANTIC = ("buffers", "tensors", "kernels", "programs", "requires", "batch", "training", "memory")


def _damaged_bytes(good: bytes, rng: random.Random):
    for _ in range(2500):
        yield "truncated", good[:rng.randrange(len(good))]
    for _ in range(2500):
        data = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        yield "bit flip", bytes(data)
    for n in (1, 7, 4096):
        yield "appended", good + b"\0" * n
    yield "empty", b""
    yield "not msgpack", seal({}, b"")[:20] + b"\xc1" * 10
    head = bytearray(good)
    struct.pack_into("<Q", head, 12, (1 << 64) - 1)  # huge declared manifest length
    yield "huge manifest length", bytes(head)


def _safetensors_header(blob: bytes):
    n = struct.unpack_from("<Q", blob, 0)[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _safetensors(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def _bad_weights(m: dict, blob: bytes, rng: random.Random):
    """Safetensors blobs that disagree with the manifest or with themselves (re-hashed, so
    only the validation of the weights stands in the way)."""
    header, data = _safetensors_header(blob)
    names = [k for k in header if k != "__metadata__"]
    for _ in range(300):
        h = copy.deepcopy(header)
        d = data
        name = rng.choice(names)
        choice = rng.randrange(8)
        if choice == 0:  # overlapping offsets
            other = rng.choice([k for k in names if k != name] or names)
            h[name]["data_offsets"] = list(h[other]["data_offsets"])
        elif choice == 1:  # out of range
            a, b = h[name]["data_offsets"]
            h[name]["data_offsets"] = [a, len(data) + rng.randrange(1, 1 << 20)]
        elif choice == 2:  # shape that disagrees with the manifest (size kept consistent)
            shape = h[name]["shape"]
            h[name]["shape"] = [int(np.prod(shape)), 1] if len(shape) != 2 else [1, int(np.prod(shape))]
            if h[name]["shape"] == shape:
                h[name]["shape"] = shape + [1]
        elif choice == 3:  # dtype that disagrees
            h[name]["dtype"] = rng.choice(["F64", "I32", "F16", "BOOL", "Q8"])
        elif choice == 4:  # a tensor the manifest needs is missing
            del h[name]
            a, b = header[name]["data_offsets"]
            d = data[:a] + data[b:]
            for k in h:
                if k != "__metadata__" and h[k]["data_offsets"][0] >= b:
                    h[k]["data_offsets"] = [x - (b - a) for x in h[k]["data_offsets"]]
        elif choice == 5:  # a tensor the manifest does not know
            h["junk"] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
            d = data + b"\0" * 8
        elif choice == 6:  # header length beyond the blob
            raw = _safetensors(h, d)
            yield "weights header length", raw[:0] + struct.pack("<Q", len(raw) * 4) + raw[8:]
            continue
        else:  # header that is not JSON
            raw = _safetensors(h, d)
            n = struct.unpack_from("<Q", raw, 0)[0]
            yield "weights header not JSON", raw[:8] + b"{" * n + raw[8 + n:]
            continue
        yield f"weights {choice}", _safetensors(h, d)


def _checksums(blob: bytes, chunk: int) -> bytes:
    return b"".join(struct.pack(">I", zlib.crc32(blob[o:o + chunk])) for o in range(0, len(blob), chunk)) \
        or struct.pack(">I", 0)


def _reblob(m: dict, blob: bytes) -> bytes:
    ck = m["blob_checksum"]
    return seal(m | {"blob_checksum": ck | {"values": _checksums(blob, ck["chunk_bytes"])}}, blob)


class CountingDevice:
    """A wgpu device that adds up the bytes of every buffer created through it."""

    def __init__(self, device):
        self._device, self.bytes = device, 0

    def create_buffer(self, **kw):
        buf = self._device.create_buffer(**kw)
        self.bytes += kw["size"]
        return buf

    def __getattr__(self, name):
        return getattr(self._device, name)


def _run_loaded(device, pkg, rng):
    """A mutated package that loaded must run, allocate no more than its manifest says,
    and leave the device usable."""
    counting = CountingDevice(device)
    try:
        session = Session(counting, pkg)
    except PackageError as exc:
        assert str(exc)
        return "refused at session"
    m = pkg.manifest
    for name, p in m["programs"].items():
        inputs = {}
        for k, ti in p["inputs"].items():
            t = m["tensors"][ti]
            if k == p.get("row_mask"):
                continue
            inputs[k] = (rng.integers(0, 2, t["shape"]) if t["dtype"] == "i32"
                         else rng.standard_normal(t["shape"]).astype(np.float32))
        try:
            session.run(name, inputs)
        except FloatingPointError:
            pass  # a NaN loss from mutated weights is reported, not a crash
        except PackageError as exc:  # a kernel only the training step runs: compiled behind the load
            assert name == "train_step" and "rejected by the WGSL compiler" in str(exc), (name, exc)
            assert session.training_error is not None
            for other, q in m["programs"].items():  # (the others run on)
                if other != name:
                    session.run(other, {k: v for k, v in inputs.items() if k in q["inputs"]})
            session.close()
            return "refused at training"
    staging = sum(-(-max(4, int(np.prod(m["tensors"][ti]["shape"])) * 4) // 8) * 8
                  for p in m["programs"].values() for ti in p["outputs"].values())
    # and the uniform buffer of lifted sizes: a 256-byte slice per distinct set (MAX_LIFTED u32s)
    lifted = {tuple(e["lifted"]) for p in m["programs"].values() for d in p["dispatches"]
              for e in (d, *d.get("variants", {}).values()) if e.get("lifted")}
    assert counting.bytes <= m["memory"]["buffer_bytes"] + staging + 256 * len(lifted)
    return "ran"


def run_cases(device, cases, nrng, expect=None) -> dict:
    """Load each (what, bytes) case: refused with a PackageError naming the problem (never an
    "invalid manifest (" the validator missed), or loaded and run (_run_loaded); outcome counts.
    `expect(what, loaded, error)` may check a case's outcome."""
    outcomes = {}
    for what, data in cases:
        try:
            pkg = Package.from_bytes(data)
        except PackageError as exc:
            assert "invalid manifest (" not in str(exc), f"{what}: a case the validator missed: {exc}"
            if expect:
                expect(what, False, exc)
            outcomes["refused"] = outcomes.get("refused", 0) + 1
            continue
        if expect:
            expect(what, True, None)
        outcome = _run_loaded(device, pkg, nrng)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


def test_ten_thousand_mutated_packages(good, device):
    """Each case raises PackageError naming the problem, or loads and runs; none crashes,
    hangs, allocates more than its manifest declares, or loses the device."""
    rng = random.Random(1234)
    nrng = np.random.default_rng(5)
    m, blob = split(good)
    good_pkg = Package.from_bytes(good)
    cases = list(_damaged_bytes(good, rng))
    while len(cases) < 6000:  # well-sealed manifests that break the rules
        cases += [(what, seal(mm, blob)) for what, mm in _manifest_mutations(m, rng)]
    cases += [(what, seal(mm, blob)) for what, mm in _type_confusion(m, rng, 3800)]
    cases += [(what, _reblob(m, b)) for what, b in _bad_weights(m, blob, rng)]
    cases.append(("bad blob", _reblob(m, b"junk")))
    assert len(cases) >= 10_000
    outcomes = {}
    start = time.perf_counter()
    for what, data in cases:
        t = time.perf_counter()
        try:
            pkg = Package.from_bytes(data)
        except PackageError as exc:
            assert str(exc), what
            assert "invalid manifest (" not in str(exc), f"{what}: a case the validator missed: {exc}"
            outcomes["refused"] = outcomes.get("refused", 0) + 1
            continue
        except Exception as exc:
            pytest.fail(f"{what}: {type(exc).__name__} instead of PackageError: {exc}")
        finally:
            assert time.perf_counter() - t < 1.0, f"{what}: validation took too long"
        same = all(pkg.manifest.get(k) == m.get(k) for k in SEMANTIC) and pkg.weights.keys() == good_pkg.weights.keys()
        if same and outcomes.get("ran", 0) >= 3:
            outcome = "metadata only"  # runs exactly as the good package (which runs below)
        else:
            outcome = _run_loaded(device, pkg, nrng)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    elapsed = time.perf_counter() - start
    print(f"{len(cases)} mutated packages in {elapsed:.1f} s: {outcomes}")
    assert outcomes["refused"] > 0.9 * len(cases)
    assert elapsed < 120
    # the device is still fine: the good package runs and matches the float64 oracle
    _check_good_package_runs(device, good_pkg)


def _check_good_package_runs(device, pkg):
    session = Session(device, pkg)
    x = np.random.default_rng(9).standard_normal((8, 12)).astype(np.float32)
    w = pkg.weights
    ref = np.maximum(x @ w["fc1.weight"].T.astype(np.float64) + w["fc1.bias"], 0) @ w["fc2.weight"].T + w["fc2.bias"]
    got = session.run("infer", {"x": x})["logits"]
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_sizes_beyond_the_device_are_refused_before_any_allocation(good, device):
    m, blob = split(good)
    limits = device.limits
    biggest = min(limits["max-buffer-size"], limits["max-storage-buffer-binding-size"])
    cases = []
    mm = copy.deepcopy(m)
    mm["buffers"][0] = -(-(biggest + 4) // 4) * 4  # declares more than the device can hold
    mm["memory"]["buffer_bytes"] = sum(mm["buffers"])
    cases.append(("buffer", mm, "largest storage buffer"))
    mm = copy.deepcopy(m)
    mm["programs"]["infer"]["dispatches"][0]["workgroups"] = [limits["max-compute-workgroups-per-dimension"] + 1, 1, 1]
    cases.append(("workgroups", mm, "workgroups"))
    mm = copy.deepcopy(m)
    mm["kernels"][0]["workgroup_size"] = [1024, 1024, 1]
    cases.append(("workgroup size", mm, "workgroup size"))
    for what, mm, msg in cases:
        counting = CountingDevice(device)
        with pytest.raises(PackageError, match=msg):
            Session(counting, Package.from_bytes(seal(mm, blob)))
        assert counting.bytes == 0, what
    counting = CountingDevice(device)
    with pytest.raises(GPUOutOfMemoryError, match="memory_limit"):
        Session(counting, Package.from_bytes(good), memory_limit=1000)
    assert counting.bytes == 0


def test_kernels_whose_bindings_disagree_with_the_manifest(good, device):
    """The WGSL declares its bindings; the manifest declares them again. Any disagreement
    that wgpu's validation sees is a PackageError at load (for a kernel only the training step
    runs, made with its training state: the training step's error, inference running on), never
    an error in a frame."""
    m, blob = split(good)
    rng = random.Random(7)
    refused = ran = 0
    for i in range(len(m["kernels"])):
        for change in ("flip access", "drop binding", "add binding"):
            mm = copy.deepcopy(m)
            k = mm["kernels"][i]
            if change == "flip access":
                j = rng.randrange(len(k["access"]))
                k["access"][j] = "read" if k["access"][j] == "read_write" else "read_write"
            elif change == "drop binding":
                k["access"].pop()
            else:
                k["access"].append("read")
            for p in mm["programs"].values():  # keep the dispatches consistent with the new access list
                for d in p["dispatches"]:
                    for v in [d, *d.get("variants", {}).values()]:
                        if v["kernel"] == i:
                            d["buffers"] = (d["buffers"][:len(k["access"])] + [0] * len(k["access"]))[:len(k["access"])]
            try:
                pkg = Package.from_bytes(seal(mm, blob))
                with Session(device, pkg) as s:
                    s.programs  # noqa: B018  (waits for the training state)
                    if s.training_error is not None:
                        raise s.training_error
            except PackageError as exc:
                assert str(exc)
                refused += 1
            else:
                ran += 1  # e.g. an unused extra binding: harmless, and it runs
    assert refused > 0
    _check_good_package_runs(device, Package.from_bytes(good))


def test_wgsl_edits_compile_or_are_refused(good, device):
    """Random edits of kernel text: wgpu's WGSL compiler rejects them (PackageError: from the
    Session, or from the training step for a kernel only it runs, inference running on), or they
    compile into a kernel that runs (within its bounds-checked buffers)."""
    m, blob = split(good)
    rng = random.Random(11)
    refused = 0
    for _ in range(60):
        mm = copy.deepcopy(m)
        k = mm["kernels"][rng.randrange(len(mm["kernels"]))]
        text = k["wgsl"]
        pos = rng.randrange(len(text))
        k["wgsl"] = text[:pos] + rng.choice(["", "(", "}", "@", "var", "1e99", "\x00", "u"]) + text[pos + rng.randrange(2):]
        for kk in mm["kernels"]:  # the variants too, so whichever this device picks is edited
            if kk is not k and kk["entry"] == k["entry"] and rng.random() < 0.5:
                kk["wgsl"] = k["wgsl"]
        outcome = _run_loaded(device, Package.from_bytes(seal(mm, blob)), np.random.default_rng(0))
        refused += outcome.startswith("refused")
    assert refused > 20
    _check_good_package_runs(device, Package.from_bytes(good))


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


def test_a_file_read_in_many_parts_equals_its_bytes(good, tmp_path, monkeypatch):
    from meganeura.runtime import package as package_module

    path = tmp_path / "p.mnpk"
    path.write_bytes(good)
    monkeypatch.setattr(package_module, "READ_STEP", 1000)  # dozens of parts on threads
    assert len(good) > 20 * 1000
    from_file, from_bytes = Package.load(path), Package.from_bytes(good)
    assert from_file.manifest == from_bytes.manifest
    for name, value in from_bytes.weights.items():
        np.testing.assert_array_equal(from_file.weights[name], value)
        assert not from_file.weights[name].flags.writeable  # views of the package's bytes
    path.write_bytes(good[:-7])
    with pytest.raises(PackageError, match="truncated"):
        Package.load(path)


@pytest.mark.parametrize("entry", [{"dtype": ["F32"]}, {"shape": [1 << 32, 1 << 32]}, {"dtype": None}],
                         ids=["dtype-list", "shape-overflow", "dtype-none"])
def test_odd_safetensors_headers_are_package_errors(good, entry):
    """The runtime parses the blob's safetensors header itself: values of the wrong type or
    shapes whose element count overflows 64 bits are named, never a TypeError or a reshape."""
    m, blob = split(good)
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name].update(entry)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    new_blob = struct.pack("<Q", len(text)) + text + blob[8 + n:]
    m["blob_checksum"]["values"] = b"".join(
        struct.pack(">I", zlib.crc32(new_blob[o:o + m["blob_checksum"]["chunk_bytes"]]))
        for o in range(0, len(new_blob), m["blob_checksum"]["chunk_bytes"]))
    with pytest.raises(PackageError, match="weights"):
        Package.from_bytes(seal(m, new_blob))
    deep = struct.pack("<Q", 40000) + b"[" * 40000 + blob[8 + n:]
    m["blob_checksum"]["values"] = b"".join(
        struct.pack(">I", zlib.crc32(deep[o:o + m["blob_checksum"]["chunk_bytes"]]))
        for o in range(0, len(deep), m["blob_checksum"]["chunk_bytes"]))
    with pytest.raises(PackageError, match="weights"):
        Package.from_bytes(seal(m, deep))


def test_gradients_of_one_arena_are_written_apart(device):
    """Three gradients written by one dispatch into their arena: distinct ranges load and
    train; the same dispatch with two ranges overlapping is refused before the GPU sees it."""
    b = Builder()
    x = b.input("x", (2, 3))
    out = None
    for i in range(3):
        w = b.param(f"w{i}", np.array([[1.0, 2.0, 3.0]]))
        term = b.sum(b.sqrt(w) * x, axes=(1,), keepdims=True)
        out = term if out is None else out + term
    b.output("y", b.reshape(out, (2, 1)))
    data = compile_model(b.build(), TrainConfig(loss="mse"))
    m, blob = split(data)
    access = lambda d: m["kernels"][d["kernel"]]["access"]  # noqa: E731
    hits = [(j, [k for k, a in enumerate(access(d)) if a == "read_write"])
            for j, d in enumerate(m["programs"]["train_step"]["dispatches"])]
    j, rw = next((j, rw) for j, rw in hits if len(rw) == 3 and len({m["programs"]["train_step"]["dispatches"][j]
                                                                      ["buffers"][k] for k in rw}) == 1)
    session = Session(device, Package.from_bytes(data))
    session.run("train_step", {"x": np.ones((2, 3)), "labels": np.zeros((2, 1))})
    assert session.skipped_steps == 0
    d = m["programs"]["train_step"]["dispatches"][j]
    d["ranges"][rw[1]] = list(d["ranges"][rw[0]])
    with pytest.raises(PackageError, match="written twice where ranges meet"):
        Package.from_bytes(seal(m, blob))
