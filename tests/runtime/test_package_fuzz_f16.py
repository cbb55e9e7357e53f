"""The package rules hold for a package with f16 weights too (test_package_fuzz.py's cases)."""
import random

import numpy as np
from meganeura.compiler import Builder, TrainConfig, compile_model
from meganeura.runtime import Package
from test_package_fuzz import (
    _bad_weights,
    _check_good_package_runs,
    _manifest_mutations,
    _reblob,
    _type_confusion,
    run_cases,
    seal,
    split,
)


def test_mutated_packages_with_half_weights(device):
    """The same rules hold for a package with f16 weights (a frozen layer's, F16 in the blob):
    mutations of its manifest and weights are refused by name, or load and run."""
    rng_w = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (8, 12))
    w1 = b.param("fc1.weight", rng_w.standard_normal((16, 12)), frozen=True)
    h = b.relu(b.linear(x, w1, b.param("fc1.bias", np.zeros(16))))
    b.output("logits", b.linear(h, b.param("fc2.weight", rng_w.standard_normal((5, 16))), b.param("fc2.bias", np.zeros(5))))
    good = compile_model(b.build(), TrainConfig(optimizer="adamw", lr=0.01), weights="f16")
    good_pkg = Package.from_bytes(good)
    assert good_pkg.weights["fc1.weight"].dtype == np.float16
    m, blob = split(good)
    rng, nrng = random.Random(77), np.random.default_rng(6)
    cases = [(what, seal(mm, blob)) for what, mm in _manifest_mutations(m, rng)]
    cases += [(what, seal(mm, blob)) for what, mm in _type_confusion(m, rng, 600)]
    cases += [(what, _reblob(m, bb)) for what, bb in _bad_weights(m, blob, rng)]
    outcomes = run_cases(device, cases, nrng)
    assert outcomes["refused"] > 0.9 * len(cases), outcomes
    _check_good_package_runs(device, good_pkg)
