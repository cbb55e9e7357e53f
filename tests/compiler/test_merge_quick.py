"""compiler/codegen/merge_quick.py: the quick tier's kernels that bind alike share pipelines, a lifted
selector picking each dispatch's member; the quick tier computes what it did unmerged."""
import re

import numpy as np
import pytest
from meganeura.compiler import TrainConfig, compile_model
from meganeura.compiler.codegen import merge_quick
from meganeura.runtime import Package, Session
from meganeura.compiler.options import CompileOptions
from meganeura.runtime.package import QUICK, kernels_of
from meganeura.runtime.workgroup_memory import workgroup_bytes

CONFIG = TrainConfig(loss="mse", optimizer="adamw", lr=1e-2)


def _package(model, merged):
    return Package.from_bytes(compile_model(model, CONFIG, options=CompileOptions(merge_quick=merged)))


def _kernel(wgsl, access=("read", "read_write"), lifted=0, label="k"):
    return {"label": label, "wgsl": wgsl, "entry": "main", "workgroup_size": [64, 1, 1], "access": list(access),
            "sha256": "", **({"lifted": lifted} if lifted else {})}


SCALE = """@group(0) @binding(2) var<uniform> mn_sizes: array<vec4<u32>, 1>;
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
fn f(v: f32) -> f32 { return v * {{SCALE}}; }
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= mn_sizes[0u][0u]) { return; }
    y[gid.x] = f(x[gid.x]);
}
"""
SUM = """@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> f: array<f32>;
var<workgroup> part: array<f32, {{N}}>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    part[lid] = a[wg.x * 64u + lid];
    workgroupBarrier();
    if (lid == 0u) {
        var s = 0.0;
        for (var i = 0u; i < 64u; i = i + 1u) { s = s + part[i]; }
        f[wg.x] = s;
    }
}
"""


def _programs(kernels):
    """One quick-only dispatch per kernel, after a tuned kernel of its own (index len + i)."""
    return {"infer": {"dispatches": [
        {"kernel": len(kernels) + i, "buffers": [0, 1], "workgroups": [1, 1, 1],
         "variants": {QUICK: {"kernel": i, "workgroups": [1, 1, 1],
                              **({"lifted": [7] * k["lifted"]} if k.get("lifted") else {})}}}
        for i, k in enumerate(kernels)]}}


OFFSET = """@group(0) @binding(2) var<uniform> mn_sizes: array<vec4<u32>, 1>;
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    if (gid.x >= mn_sizes[0u][0u] * n.x) { return; }
    dst[gid.x + mn_sizes[0u][1u]] = src[gid.x] + f32(mn_sizes[0u][2u]);
}
"""


def test_members_keep_their_own_names_and_a_selector_picks_each(device):
    kernels = [_kernel(SCALE.replace("{{SCALE}}", "2.0"), lifted=1, label="scale"),
               _kernel(SUM.replace("{{N}}", "64"), label="sum"), _kernel(OFFSET, lifted=3, label="offset")]
    own = ["_f(mn_b0[gid.x])", "mn_b1[wg.x] = s", "+ f32(mn_sizes[0u][2u])"]  # each member's own statement
    tuned = [_kernel(SUM.replace("{{N}}", "64") + f"// tuned {i}\n") for i in range(3)]
    new, programs = merge_quick.merge(kernels + tuned, _programs(kernels))
    assert len(new) == 4  # one merged kernel and the three tuned ones
    merged = next(k for k in new if "merged" in k["label"])
    text = merged["wgsl"]
    assert merged["label"].endswith("(quick)") and "scale" in merged["label"]
    assert merged["lifted"] == 4 and "switch mn_sizes[0u][3u]" in text  # after the longest member's 3 sizes
    assert text.count("var<workgroup>") == 1 and re.search(r"fn mnq\d_f\(", text)  # a helper and a binding both named f
    cases = dict(re.findall(r"case (\d+)u: \{(.*?)\n    \}", text, re.S))
    for i, d in enumerate(programs["infer"]["dispatches"]):
        v = d["variants"][QUICK]
        assert new[v["kernel"]] is merged and len(v["lifted"]) == 4
        assert own[i] in cases[str(v["lifted"][-1])], (i, v["lifted"])  # the selector picks this member's case
        assert v["lifted"][:-1] == [7] * kernels[i].get("lifted", 0) + [0] * (3 - kernels[i].get("lifted", 0))
    assert sorted(d["variants"][QUICK]["lifted"][-1] for d in programs["infer"]["dispatches"]) == [0, 1, 2]
    # valid WGSL for the device's compiler (naga), members' barriers in uniform control flow included
    device.create_compute_pipeline(layout="auto", compute={"module": device.create_shader_module(code=text),
                                                           "entry_point": "main"})


def test_what_it_cannot_rename_or_fit_stays_alone(monkeypatch):
    kernels = [_kernel("enable f16;\n" + SUM.replace("{{N}}", "64")),  # a directive: not merged
               _kernel(SUM.replace("{{N}}", "2048").replace("part", "big")),  # 8 KiB + 8 KiB > ...
               _kernel(SUM.replace("{{N}}", "2048").replace("part", "big2"))]
    monkeypatch.setattr(merge_quick, "WORKGROUP_BYTES", 12 << 10)  # ... 12 KiB: apart
    tuned = [_kernel(SUM.replace("{{N}}", "64") + f"// tuned {i}\n") for i in range(3)]
    new, programs = merge_quick.merge(kernels + tuned, _programs(kernels))
    assert new == kernels + tuned
    monkeypatch.setattr(merge_quick, "WORKGROUP_BYTES", 16 << 10)
    new, _ = merge_quick.merge(kernels + tuned, _programs(kernels))
    assert len(new) == 5 and workgroup_bytes(next(k for k in new if "merged" in k["label"])["wgsl"]) == 16 << 10


def test_a_type_sized_by_a_constant_stays_alone():
    named = "const N = 64u;\n" + SUM.replace("{{N}}", "N")  # renamed with its member, the type would name nothing
    kernels = [_kernel(named), _kernel(named + "\n")]
    tuned = [_kernel(SUM.replace("{{N}}", "64") + f"// tuned {i}\n") for i in range(2)]
    new, _ = merge_quick.merge(kernels + tuned, _programs(kernels))
    assert new == kernels + tuned


def test_a_kernel_another_tier_runs_is_not_merged():
    kernels = [_kernel(SUM.replace("{{N}}", "64")), _kernel(SUM.replace("{{N}}", "64") + "\n")]
    programs = _programs(kernels)
    programs["infer"]["dispatches"][0]["kernel"] = 0  # the tuned tier runs kernel 0 too
    new, _ = merge_quick.merge(kernels + [_kernel(SUM.replace("{{N}}", "64") + "// t\n")] * 2, programs)
    assert not any("merged" in k["label"] for k in new)


def test_the_training_steps_own_kernels_merge_apart_from_the_loads():
    """A Session compiles the kernels only the training step runs behind its load
    (runtime/training_state.py): no merged pipeline holds both kinds."""
    kernels = [_kernel(SUM.replace("{{N}}", "64") + "\n" * i) for i in range(4)]
    both = _programs(kernels)["infer"]["dispatches"]
    programs = {"infer": {"dispatches": both[:2]}, "train_step": {"dispatches": both[1:]}}  # kernel 1 in both
    new, out = merge_quick.merge(kernels + [_kernel(SUM.replace("{{N}}", "64") + f"// t{i}\n") for i in range(4)],
                                 programs)
    members = {name: {d["variants"][QUICK]["kernel"] for d in p["dispatches"]} for name, p in out.items()}
    cases = {name: sorted(new[i]["wgsl"].count("    case ") for i in ks) for name, ks in members.items()}
    assert cases == {"infer": [2], "train_step": [2, 2]}  # kernels 0 and 1 merged, 2 and 3 apart from them
    assert len(members["train_step"] - members["infer"]) == 1


def test_the_merged_quick_tier_trains_as_it_did_unmerged(device, hold_tuned, cnn_with_size_variants, monkeypatch):
    model, inputs = cnn_with_size_variants
    plain, merged = _package(model, False), _package(model, True)
    m = merged.manifest
    quick = kernels_of(m, QUICK)
    joined = [i for i in quick if "merged" in m["kernels"][i]["label"]]
    assert joined and len(quick) < len(kernels_of(plain.manifest, QUICK))
    for i in joined:  # merged kernels serve quick variants only, and hold at most MERGE_CHARS of members
        k = m["kernels"][i]
        assert not any(d["kernel"] == i for p in m["programs"].values() for d in p["dispatches"])
        assert k["wgsl"].count("    case ") >= 2
    losses, sessions = [], [Session(device, pkg, device_class="gpu", quick_start=True) for pkg in (plain, merged)]
    for s in sessions:
        assert s.tier == "quick"
        out = s.run("infer", {"x": inputs["x"]})["y"]
        losses.append(([float(s.run("train_step", inputs)["loss"]) for _ in range(3)], out, s.weights()))
        assert s.tier == "quick"  # (every step ran on it)
    hold_tuned.set()  # (before close(), which waits for the tuned compiles under way)
    for s in sessions:
        s.close()
    (want_losses, want_out, want_w), (got_losses, got_out, got_w) = losses
    # the same statements in the same order: bit-identical (on the H200, SD-1.5's noise prediction too)
    np.testing.assert_array_equal(got_out, want_out)
    np.testing.assert_array_equal(got_losses, want_losses)
    for name, w in want_w.items():
        np.testing.assert_array_equal(got_w[name], w, err_msg=name)


@pytest.mark.parametrize("per_bin, bins", [(0, 5), (2, 3), (5, 1)])
def test_bins_hold_at_most_merge_chars(per_bin, bins, monkeypatch):
    kernels = [_kernel(SUM.replace("{{N}}", "64") + "\n" * i) for i in range(5)]
    monkeypatch.setattr(merge_quick, "MERGE_CHARS", per_bin * len(kernels[-1]["wgsl"]))
    got = merge_quick._bins(list(range(5)), kernels)
    assert sorted(i for b in got for i in b) == list(range(5)) and len(got) == bins
    assert all(len(b) == 1 or sum(len(kernels[i]["wgsl"]) for i in b) <= merge_quick.MERGE_CHARS for b in got)
