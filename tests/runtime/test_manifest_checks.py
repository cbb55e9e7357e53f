"""runtime/manifest_checks.py: the dispatches' quick check (_plain_dispatch, no messages made)
passes only what the full check (_check_dispatch, which names the problem) passes."""
import copy
import random

import pytest
from meganeura.compiler import TrainConfig, compile_model
from meganeura.runtime.errors import PackageError
from meganeura.runtime.manifest_checks import _check_dispatch, _plain_dispatch
from test_package_fuzz import _get, _paths, _set, split

ODD = [None, True, False, -1, 0, 1, 3, 255, 256, 1 << 31, (1 << 31) + 1, (1 << 32) - 1, 1 << 32, 1 << 40, 1.0, "1",
       [], [0], [0, 256], [256, 4], {}, {"kernel": 0}]


@pytest.fixture
def manifest(cnn_with_size_variants):
    """A training package's manifest whose dispatches have lifted sizes, bound ranges (shared
    scratch), quick variants, and buffers bound twice."""
    model, _ = cnn_with_size_variants
    m, _ = split(compile_model(model, TrainConfig(optimizer="adamw", lr=0.01), share_scratch=True))
    dispatches = [d for p in m["programs"].values() for d in p["dispatches"]]
    assert any("lifted" in d for d in dispatches) and any("ranges" in d for d in dispatches)
    assert any("quick" in d.get("variants", {}) for d in dispatches)
    return m


def _full(d, m, version) -> bool:
    try:
        _check_dispatch(d, "d", m["kernels"], m["buffers"], version)
    except PackageError:
        return False
    return True


def _written_twice(d, m) -> bool:
    access = m["kernels"][d["kernel"]]["access"]
    return any(d["buffers"].count(b) > 1 for b, a in zip(d["buffers"], access) if a == "read_write")


def test_a_compiled_packages_dispatches_take_the_quick_check(manifest):
    """Every dispatch but those writing a buffer bound twice (the full rules for overlaps)."""
    dispatches = [d for p in manifest["programs"].values() for d in p["dispatches"]]
    for d in dispatches:
        assert _full(d, manifest, 5)
        assert _plain_dispatch(d, manifest["kernels"], manifest["buffers"], True) == (not _written_twice(d, manifest))
    # a read-only buffer bound twice is common (x * x) and quick
    assert any(len(set(d["buffers"])) < len(d["buffers"]) and not _written_twice(d, manifest) for d in dispatches)


def _mutants(d):
    """(what, copy of dispatch d): each value inside it replaced by odd ones (types, bounds, the
    edges of ranges) or deleted; another key added to it and to its variants."""
    for path in list(_paths(d)):
        value = _get(d, path)
        near = [value + delta for delta in (-256, -4, -1, 1, 4, 256)] if type(value) is int else []
        for odd in ODD + near:
            mutated = copy.deepcopy(d)
            _set(mutated, path, odd)
            yield f"{path} = {odd!r}", mutated
        mutated = copy.deepcopy(d)
        del _get(mutated, path[:-1])[path[-1]]
        yield f"{path} deleted", mutated
    for where in [()] + [("variants", cls) for cls in d.get("variants", {})]:
        mutated = copy.deepcopy(d)
        _get(mutated, where)["extra"] = 1
        yield f"{where} + extra", mutated


@pytest.mark.parametrize("version", [5, 4])
def test_the_quick_check_passes_nothing_the_full_check_refuses(manifest, version):
    """Whatever _plain_dispatch passes of a dispatch made odd (_mutants), _check_dispatch passes."""
    rng = random.Random(version)
    kernels, buffers = manifest["kernels"], manifest["buffers"]
    dispatches = [d for p in manifest["programs"].values() for d in p["dispatches"]]
    counts = {"refused": 0, "quick": 0, "full only": 0}
    for d in rng.sample(dispatches, min(60, len(dispatches))):
        for what, mutated in _mutants(d):
            quick = _plain_dispatch(mutated, kernels, buffers, version >= 5)
            full = _full(mutated, manifest, version)
            assert full or not quick, f"the quick check passed what the full check refuses: {what}"
            counts["refused" if not full else "quick" if quick else "full only"] += 1
    # (the mutations reach both verdicts, and the quick path takes most of what passes)
    assert counts["refused"] > 1000 and counts["quick"] > 300, counts
