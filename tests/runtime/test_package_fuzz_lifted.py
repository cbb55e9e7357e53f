"""The package rules hold for kernels that read lifted sizes (compiler/codegen/lift_sizes.py):
test_package_fuzz.py's mutations, and ones aimed at the "lifted" fields."""
import copy
import random

import numpy as np
from meganeura.compiler import TrainConfig, compile_model
from test_package_fuzz import (
    _manifest_mutations,
    _type_confusion,
    run_cases,
    seal,
    split,
)


def _lifted_mutations(m: dict, rng: random.Random, count: int):
    """Manifests whose lifted sizes are wrong in type, count or range, or appear where no
    kernel reads them; and some that stay valid (other sizes: they load and run)."""
    spots = [(name, j) for name, p in m["programs"].items() for j, d in enumerate(p["dispatches"]) if "lifted" in d]
    plain = [(name, j) for name, p in m["programs"].items() for j, d in enumerate(p["dispatches"]) if "lifted" not in d]
    kernels = [i for i, k in enumerate(m["kernels"]) if k.get("lifted")]
    assert spots and plain and kernels
    bad_values = [-1, 1 << 32, 1.5, "3", None, [1], True]
    for _ in range(count):
        mm = copy.deepcopy(m)
        how = rng.randrange(6)
        name, j = rng.choice(spots)
        d = mm["programs"][name]["dispatches"][j]
        if how == 0:
            d["lifted"][rng.randrange(len(d["lifted"]))] = rng.choice(bad_values)
            yield "lifted: a value of the wrong type or range", mm
        elif how == 1:
            d["lifted"] = d["lifted"][:-1] if rng.random() < 0.5 else d["lifted"] + [1]
            yield "lifted: values of the wrong count", mm
        elif how == 2:
            del d["lifted"]
            yield "lifted: a dispatch without the sizes its kernel reads", mm
        elif how == 3:
            pn, pj = rng.choice(plain)
            mm["programs"][pn]["dispatches"][pj]["lifted"] = [1, 2]
            yield "lifted: sizes for a kernel that reads none", mm
        elif how == 4:
            k = mm["kernels"][rng.choice(kernels)]
            k["lifted"] = rng.choice([0, k["lifted"] + 1, 65, -1, "2"])
            yield "lifted: a kernel's count changed", mm
        else:  # valid: other (small) sizes, as a package for another shape would hold
            d["lifted"] = [max(0, v + rng.choice([-1, 1])) for v in d["lifted"]]
            yield "lifted ok: other sizes", mm


def test_mutated_packages_with_lifted_sizes(device, cnn_with_size_variants):
    model, _ = cnn_with_size_variants
    good = compile_model(model, TrainConfig(optimizer="adamw", lr=0.01))
    m, blob = split(good)
    assert any(k.get("lifted") for k in m["kernels"])
    rng, nrng = random.Random(78), np.random.default_rng(7)
    cases = [(what, seal(mm, blob)) for what, mm in _lifted_mutations(m, rng, 600)]
    cases += [(what, seal(mm, blob)) for what, mm in _manifest_mutations(m, rng)]
    cases += [(what, seal(mm, blob)) for what, mm in _type_confusion(m, rng, 300)]

    def expect(what, loaded, error):
        assert loaded or not what.startswith("lifted ok"), f"{what}: refused: {error}"
        assert not loaded or not what.startswith("lifted: "), f"{what}: loaded"
    outcomes = run_cases(device, cases, nrng, expect)
    assert outcomes["refused"] > 0.5 * len(cases) and outcomes.get("ran", 0) > 0, outcomes
