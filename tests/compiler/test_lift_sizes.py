"""compiler/codegen/lift_sizes.py: kernels that differ only in sizes become one kernel reading them
from a uniform buffer; the runtime binds each dispatch's values; answers do not change."""
import numpy as np
import pytest
from meganeura.compiler import TrainConfig, compile_model
from meganeura.compiler.codegen import lift_sizes
from meganeura.compiler.options import CompileOptions
from meganeura.runtime import Package, PackageError, Session

ELEMENTWISE = """@group(0) @binding(0) var<storage, read> t0: array<f32>;
@group(0) @binding(1) var<storage, read_write> t1: array<f32>;
const WIDTH: u32 = {width}u;  // a constant WGSL needs: stays
var<workgroup> part: array<f32, {part}u>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let idx = gid.x;  // {n} values
    if (idx >= {n}u) {{
        return;
    }}
    switch (idx % 2u) {{
        case 1u: {{ t1[idx] = t0[(idx * {row}u + {div}u) % 7u] / f32(idx / {div}u); }}
        default: {{ t1[idx] = 0.0; }}
    }}
}}
"""


def _kernel(**sizes):
    import hashlib

    wgsl = ELEMENTWISE.format(**{"width": 4, "part": 64, "n": 10, "row": 3, "div": 5, **sizes})
    return {"label": "copy", "wgsl": wgsl, "entry": "main", "workgroup_size": [256, 1, 1],
            "access": ["read", "read_write"], "sha256": hashlib.sha256(wgsl.encode()).hexdigest()}


def _programs(*kernels):
    return {"infer": {"dispatches": [{"kernel": k, "buffers": [0, 1], "workgroups": [1, 1, 1]} for k in kernels]}}


def test_literals_that_differ_are_lifted_and_constants_stay():
    kernels, programs = lift_sizes.lift([_kernel(n=10, row=3), _kernel(n=900, row=5), _kernel(n=10, row=3)],
                                        _programs(0, 1, 2))
    assert len(kernels) == 1 and kernels[0]["lifted"] == 2
    code = kernels[0]["wgsl"]
    assert "if (idx >= mn_sizes[0u][0u])" in code and "(idx * mn_sizes[0u][1u] + 5u) % 7u" in code  # 5u, 7u: the same
    assert "@binding(2) var<uniform> mn_sizes: array<vec4<u32>, 1>;" in code
    assert "const WIDTH: u32 = 4u;" in code and "array<f32, 64u>" in code and "case 1u:" in code
    assert "900 values" not in code  # comments (which name one member's sizes) go
    assert [d["lifted"] for d in programs["infer"]["dispatches"]] == [[10, 3], [900, 5], [10, 3]]
    assert {d["kernel"] for d in programs["infer"]["dispatches"]} == {0}


@pytest.mark.parametrize("differs", ["width", "part", "div"])
def test_kernels_differing_where_wgsl_needs_a_constant_or_in_a_divisor_stay_apart(differs):
    """A divisor stays a constant too: by a uniform, a division is a long sequence (ResNet-50's
    step 24.4 -> 26.8 ms on the H200 with its batch-norm reductions' divisors lifted)."""
    kernels, programs = lift_sizes.lift([_kernel(), _kernel(**{differs: 8})], _programs(0, 1))
    assert len(kernels) == 2 and not any("lifted" in k for k in kernels)
    assert all("lifted" not in d for d in programs["infer"]["dispatches"])


def test_private_arrays_and_marked_templates_are_left_alone():
    private = [_kernel(n=n) for n in (10, 20)]
    for k in private:
        k["wgsl"] = k["wgsl"].replace("let idx = gid.x;", "var acc: array<f32, 4>;\n    let idx = gid.x;")
    marked = [_kernel(n=n) for n in (10, 20)]
    for k in marked:
        k["wgsl"] = lift_sizes.FIXED + ": test\n" + k["wgsl"]
    for pair in (private, marked):
        kernels, _ = lift_sizes.lift(pair, _programs(0, 1))
        assert len(kernels) == 2


def test_device_class_variants_carry_their_own_sizes():
    kernels = [_kernel(n=10), _kernel(n=20), _kernel(n=10, row=9), _kernel(n=20, row=9)]
    programs = {"infer": {"dispatches": [
        {"kernel": 0, "buffers": [0, 1], "workgroups": [1, 1, 1],
         "variants": {"cpu": {"kernel": 2, "workgroups": [1, 1, 1]}}},
        {"kernel": 1, "buffers": [0, 1], "workgroups": [1, 1, 1]}]}}
    kernels, programs = lift_sizes.lift(kernels, programs)
    d0, d1 = programs["infer"]["dispatches"]
    assert len(kernels) == 1 and d0["kernel"] == d0["variants"]["cpu"]["kernel"] == d1["kernel"] == 0
    assert (d0["lifted"], d0["variants"]["cpu"]["lifted"], d1["lifted"]) == ([10, 3], [10, 9], [20, 3])


def test_a_training_step_is_bit_identical_with_and_without_lifting(device, monkeypatch, cnn_with_size_variants):
    model, inputs = cnn_with_size_variants
    cfg = TrainConfig(loss="mse", optimizer="adamw", lr=1e-2)
    lifted = Package.from_bytes(compile_model(model, cfg))
    assert {k["label"] for k in lifted.manifest["kernels"] if k.get("lifted")} >= {"relu", "mul+step"}
    plain = Package.from_bytes(compile_model(model, cfg, options=CompileOptions(lift_sizes=False)))
    assert len(lifted.manifest["kernels"]) < len(plain.manifest["kernels"])
    results = []
    for pkg in (lifted, plain):
        s = Session(device, pkg, device_class="gpu")
        losses = [s.run("train_step", inputs)["loss"] for _ in range(3)]
        results.append((losses, s.weights(), s.run("infer", {"x": inputs["x"]})["y"]))
    (l1, w1, y1), (l2, w2, y2) = results
    assert np.array_equal(np.asarray(l1), np.asarray(l2)) and np.array_equal(y1, y2)
    assert w1.keys() == w2.keys() and all(np.array_equal(w1[k], w2[k]) for k in w1)


def test_the_runtime_refuses_sizes_that_do_not_fit_the_kernel(cnn_with_size_variants):
    model, _ = cnn_with_size_variants
    pkg = Package.from_bytes(compile_model(model, TrainConfig(loss="mse", optimizer="adamw")))
    m = pkg.manifest
    d = next(d for d in m["programs"]["train_step"]["dispatches"] if "lifted" in d)
    good = d["lifted"]
    from meganeura.runtime.package import validate_manifest

    for bad, says in ((d["lifted"][:-1], "values for a kernel that reads"), (d["lifted"] + [1], "values for a kernel"),
                      ([-1] * len(d["lifted"]), "expected an integer"), ([1 << 32] * len(d["lifted"]), "integer")):
        d["lifted"] = bad
        with pytest.raises(PackageError, match=says):
            validate_manifest(m)
    del d["lifted"]
    with pytest.raises(PackageError, match="lifted"):
        validate_manifest(m)
    d["lifted"] = good
    validate_manifest(m)
    plain = next(d for d in m["programs"]["train_step"]["dispatches"] if not m["kernels"][d["kernel"]].get("lifted"))
    plain["lifted"] = [1]
    with pytest.raises(PackageError, match="reads no lifted sizes"):
        validate_manifest(m)


def test_format_3_packages_still_load_and_may_not_lift(device, monkeypatch, cnn_with_size_variants):
    """A package written before lifted sizes (format 3) loads and runs; one that says format 3
    but carries lifted sizes is refused."""
    from meganeura.compiler.package import writer as package_writer
    from meganeura.runtime.package import validate_manifest

    model, inputs = cnn_with_size_variants
    current = package_writer.FORMAT_VERSION
    monkeypatch.setattr(package_writer, "FORMAT_VERSION", 3)
    old = Package.from_bytes(compile_model(model, options=CompileOptions(lift_sizes=False)))
    assert old.manifest["format_version"] == 3
    y = Session(device, old, device_class="gpu").run("infer", {"x": inputs["x"]})["y"]
    monkeypatch.setattr(package_writer, "FORMAT_VERSION", current)
    new = Package.from_bytes(compile_model(model))
    np.testing.assert_array_equal(Session(device, new, device_class="gpu").run("infer", {"x": inputs["x"]})["y"], y)
    m = new.manifest
    assert any(k.get("lifted") for k in m["kernels"])
    m["format_version"] = 3
    with pytest.raises(PackageError, match="format version 3 has no lifted sizes"):
        validate_manifest(m)


def test_a_kernel_reading_more_sizes_than_it_declares_is_refused_at_load(device, cnn_with_size_variants):
    """A damaged package whose kernel declares a bigger mn_sizes than its "lifted" count: the
    binding layout's minimum size refuses the pipeline (a PackageError), not a run."""
    import hashlib

    model, _ = cnn_with_size_variants
    m = Package.from_bytes(compile_model(model)).manifest
    k = next(k for k in m["kernels"] if k.get("lifted") and not k["label"].endswith("(quick)"))  # (one the GPU runs)
    k["wgsl"] = k["wgsl"].replace("var<uniform> mn_sizes: array<vec4<u32>, ", "var<uniform> mn_sizes: array<vec4<u32>, 16 + ")
    k["sha256"] = hashlib.sha256(k["wgsl"].encode()).hexdigest()
    from meganeura.runtime.package import validate_manifest

    validate_manifest(m)  # (the manifest's fields still agree)
    pkg = Package.from_bytes(compile_model(model))
    pkg.manifest = m
    with pytest.raises(PackageError, match="rejected by the WGSL compiler"):
        Session(device, pkg, device_class="gpu")


@pytest.mark.parametrize("code, kept", [
    ("let s = t / (3u * 1u); let i = t % (7u * 1u); let z = x * 5u;", ["3u", "1u", "7u"]),
    ("var x = 2u; x /= 5u; x %= 7u; let y = t % (7u); let w = a[q / 9u] + 4u;", ["5u", "7u", "9u"]),
    ("let q = x / sizes[2u] + 4u; let r = y % f(3u, 5u) * 6u;", ["2u", "3u", "5u"]),
])
def test_divisors_stay_constants_however_written(code, kept):
    """The whole right operand of /, %, /= and %= stays written in (parenthesised, indexed,
    called); the other literals are liftable."""
    _, found, blanked = lift_sizes.skeleton("fn main() { " + code + " }")
    assert all(k in blanked for k in kept), blanked
    assert len(found) == blanked.count("#") >= 1


@pytest.mark.parametrize("code", ["const_assert 8u > 4u;\nfn main() { let q = 3u; }",
                                  "var<workgroup> p: array<f32, (64u >> 1u)>;\nfn main() { let q = 3u; }",
                                  "/* 5u */ fn main() { let q = 3u; }"])
def test_constant_places_and_block_comments(code):
    _, found, blanked = lift_sizes.skeleton(code)
    assert [v for _, _, v in found] == [3] and "#" in blanked and "5u" not in blanked


@pytest.mark.parametrize("code", ["fn main() { let a = array<u32, 4>(1u, 2u, 3u, 4u); let q = 3u; }",
                                  "struct S { a: array<f32, 4> }\nfn main() { let q = 3u; }"])
def test_value_and_struct_arrays_leave_the_kernel_alone(code):
    assert lift_sizes.skeleton(code) is None


def test_the_quick_tier_joins_kernels_lift_keeps_apart():
    """quick_tier lifts divisors and constants too, into a variant the quick tier runs; the
    kernels the GPU runs after it keep theirs."""
    kernels = [_kernel(div=5, n=10), _kernel(div=8, n=20, width=6), _kernel(div=5, n=30)]
    quick, programs = lift_sizes.quick_tier(kernels, _programs(0, 1, 2))
    fam = quick[-1]
    assert fam["label"] == "copy (quick)" and fam["lifted"] == 3
    assert "f32(idx / mn_sizes[0u][2u])" in fam["wgsl"] and "WIDTH" not in fam["wgsl"]  # (an unused constant)
    ds = programs["infer"]["dispatches"]
    assert [d["variants"]["quick"]["lifted"] for d in ds] == [[10, 5, 5], [20, 8, 8], [30, 5, 5]]
    assert {d["variants"]["quick"]["kernel"] for d in ds} == {len(quick) - 1}
    assert [quick[d["kernel"]]["wgsl"] for d in ds] == [k["wgsl"] for k in kernels]  # theirs untouched
    lifted, programs = lift_sizes.lift(quick, programs)  # then lift: 0 and 2 (sizes apart) as one
    assert len(lifted) == 3 and lifted[programs["infer"]["dispatches"][0]["variants"]["quick"]["kernel"]] == fam


def test_no_quick_family_where_lift_makes_the_same_one():
    kernels, programs = lift_sizes.quick_tier([_kernel(n=10), _kernel(n=20)], _programs(0, 1))
    assert len(kernels) == 2 and all("variants" not in d for d in programs["infer"]["dispatches"])


def test_gemms_of_one_form_share_their_quick_kernel(cnn_with_size_variants):
    """Each GEMM gets igemm_quick (one loop, loads written once) as its quick variant; those
    that differ only in sizes (here the convolutions' forward passes) are one kernel."""
    model, _ = cnn_with_size_variants
    m = Package.from_bytes(compile_model(model, TrainConfig(loss="mse", optimizer="adamw"))).manifest
    ds = [d for p in m["programs"].values() for d in p["dispatches"]]
    gemms = [d for d in ds if "fn load_a(" in m["kernels"][d["kernel"]]["wgsl"]]
    assert gemms and all("quick" in d["variants"] for d in gemms)
    conv = {d["kernel"]: d["variants"]["quick"]["kernel"] for d in gemms
            if m["kernels"][d["kernel"]]["label"] == "conv2d" and "partial" not in m["kernels"][d["kernel"]]["wgsl"]}
    assert len(conv) >= 2 and len(set(conv.values())) == 1
    assert len({d["variants"]["quick"]["kernel"] for d in gemms}) < len({d["kernel"] for d in gemms})


def test_a_constant_declared_twice_with_two_values_stays_a_name():
    code = "fn a() { const T: u32 = 4u; let x = T; }\nfn b() { const T: u32 = 8u; let y = T; }\nconst S: u32 = 3u;\nfn c() { let z = S * 2u; }"
    text = lift_sizes._inline_constants(code)
    assert text.count("const T: u32") == 2 and "const S" not in text and "let z = 3u * 2u;" in text
    field = "const N: u32 = 3u;\nstruct P {\n    N: u32,\n}\nfn c(p: P) { let z = N * p.N; }"
    assert lift_sizes._inline_constants(field) == field  # (N is also a field's name: it stays)


def test_the_runtime_refuses_a_variant_whose_sizes_do_not_fit_its_kernel(cnn_with_size_variants):
    from meganeura.runtime.package import validate_manifest

    model, _ = cnn_with_size_variants
    m = Package.from_bytes(compile_model(model, TrainConfig(loss="mse", optimizer="adamw"))).manifest
    v = next(d["variants"]["quick"] for p in m["programs"].values() for d in p["dispatches"]
             if d.get("variants", {}).get("quick", {}).get("lifted"))
    v["lifted"] = v["lifted"][:-1]
    with pytest.raises(PackageError, match=r"variants\['quick'\]\.lifted: .* values for a kernel that reads"):
        validate_manifest(m)
    v.pop("lifted")
    with pytest.raises(PackageError, match=r"variants\['quick'\]"):
        validate_manifest(m)


def test_the_quick_tier_reads_f32_and_typed_i32_literals_by_type():
    """skeleton(quick=True): f32(...) literals as their bits, typed i32 ones (3i) by their digits
    (a minus stays in the text), each marked by its type; look-alikes and constant places stay."""
    import struct

    code = ("const E: f32 = f32(2.5);\nvar<private> p: f32 = f32(0.25);\nfn main() {\n"
            "let a = vec4<f32>(1.0) * f32(1e-05) + bitcast<f32>(0x3f800000u); let v = vec2i(1, 2);\n"
            "let b = x - -3i + f32(-0.0) * f32(1e+16); let c = y % 2i + 5u; let big = f32(1e39); }")
    text, found, blanked = lift_sizes.skeleton(code, quick=True)
    lits = [text[lo:hi] for lo, hi, _ in found]
    assert lits == ["f32(1e-05)", "3i", "f32(-0.0)", "f32(1e+16)", "2i", "5u"], lits
    bits = {text[lo:hi]: v for lo, hi, v in found}
    assert bits["f32(1e-05)"] == struct.unpack("<I", struct.pack("<f", 1e-05))[0] and bits["f32(-0.0)"] == 1 << 31
    assert bits["3i"] == 3 and "- -$" in blanked and "~" in blanked and "f32(1e39)" in blanked  # (no f32: stays)
    assert lift_sizes.skeleton(code) is None or "f32(1e-05)" in lift_sizes.skeleton(code)[2]  # plain lift: u32 only


def test_kernels_differing_in_a_literals_type_stay_apart():
    a = lift_sizes.skeleton("fn main() { let q = x * f32(2.0); }", quick=True)[2]
    b = lift_sizes.skeleton("fn main() { let q = x * 2i; }", quick=True)[2]
    c = lift_sizes.skeleton("fn main() { let q = x * 2u; }", quick=True)[2]
    assert len({a, b, c}) == 3
