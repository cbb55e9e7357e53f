"""Nothing invalid reaches the weights: Session.run either returns the right answer or raises
ValueError (in the caller's terms) with every weight unchanged.

The right answer is computed here in float64 from the weights before the call: a linear layer
and PyTorch's cross-entropy with ignore_index=-100 (the mean over the rows that count).
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meganeura.compiler import Builder, TrainConfig, compile_model
from meganeura.runtime import Package, Session

BATCH, FEATURES, CLASSES, LR = 6, 5, 4, 0.1


def _model():
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (BATCH, FEATURES))
    w = b.param("fc.weight", rng.standard_normal((CLASSES, FEATURES)) * 0.5)
    bias = b.param("fc.bias", rng.standard_normal(CLASSES) * 0.1)
    b.output("logits", b.linear(x, w, bias))
    return b.build()


@pytest.fixture(scope="module")
def session(device):
    pkg = Package.from_bytes(compile_model(_model(), TrainConfig(loss="cross_entropy", optimizer="sgd", lr=LR)))
    return Session(device, pkg)


def _logits(weights, x):
    return np.asarray(x, np.float64) @ weights["fc.weight"].astype(np.float64).T + weights["fc.bias"]


def _loss(weights, x, labels):
    z = _logits(weights, x)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    keep = labels != -100
    return -logp[keep, labels[keep]].mean()


def _same(a: dict, b: dict) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in a)


ROWS = st.integers(0, 2 * BATCH)
LABEL = st.one_of(st.integers(0, CLASSES - 1), st.just(-100), st.integers(-300, 300), st.sampled_from([2**31, -2**40]))


@st.composite
def batches(draw):
    """A training batch as a user might pass it: usually right, sometimes wrong in one way."""
    n = draw(ROWS)
    x_shape = draw(st.sampled_from([(n, FEATURES), (n, FEATURES), (n, FEATURES + 1), (n,), (n, FEATURES, 1)]))
    x = draw(st.sampled_from(["float32", "float64", "int64", "bool", "complex64", "str"]))
    values = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal(x_shape)
    if draw(st.integers(0, 9)) == 0 and values.size and x in ("float32", "float64", "complex64"):
        values.flat[0] = draw(st.sampled_from([np.nan, np.inf]))
    xv = values.astype(x) if x != "str" else values.astype(str)
    labels = np.array(draw(st.lists(LABEL, min_size=n, max_size=n)), dtype=np.int64)
    how = draw(st.sampled_from(["int", "int", "int32", "float_whole", "float_half", "short", "2d"]))
    if how == "int32":
        labels = labels.astype(np.int32) if np.abs(labels).max(initial=0) < 2**31 else labels
    elif how == "float_whole":
        labels = labels.astype(np.float64)
    elif how == "float_half":
        labels = labels + 0.5
    elif how == "short":
        labels = labels[:-1]
    elif how == "2d":
        labels = labels[:, None]
    return {"x": xv, "labels": labels}


def _valid(feed) -> bool:
    x, labels = feed["x"], feed["labels"]
    n = len(labels) if np.ndim(labels) == 1 else -1
    if x.dtype.kind not in "fiub" or x.shape != (n, FEATURES) or not 0 < n <= BATCH:
        return False
    if not np.isfinite(x.astype(np.float64)).all():
        return False
    if labels.dtype.kind == "f" and not np.array_equal(labels, np.round(labels)):
        return False
    ints = labels.astype(np.int64)
    return bool(np.all((ints == -100) | ((ints >= 0) & (ints < CLASSES))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(feed=batches())
def test_a_training_step_is_right_or_refused_with_the_weights_untouched(session, feed):
    before = session.weights()
    skipped = session.skipped_steps
    if not _valid(feed):
        with pytest.raises(ValueError):
            session.run("train_step", feed)
        assert _same(before, session.weights())
        assert session.skipped_steps == skipped
        return
    labels = feed["labels"].astype(np.int64)
    loss = session.run("train_step", feed)["loss"]
    if np.all(labels == -100):  # nothing to learn from: a skipped step, as PyTorch's NaN loss would be
        assert session.skipped_steps == skipped + 1 and _same(before, session.weights())
        return
    np.testing.assert_allclose(float(np.asarray(loss).reshape(-1)[0]), _loss(before, feed["x"], labels),
                               rtol=1e-4, atol=1e-5)
    assert not _same(before, session.weights())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(feed=batches())
def test_inference_is_right_or_refused(session, feed):
    x = feed["x"]
    ok = x.dtype.kind in "fiub" and x.ndim == 2 and x.shape[1] == FEATURES and x.shape[0] > 0
    ok = ok and bool(np.isfinite(x.astype(np.float64)).all())
    if not ok:
        with pytest.raises(ValueError):
            session.run("infer", {"x": x})
        return
    got = session.run("infer", {"x": x})["logits"]
    np.testing.assert_allclose(got, _logits(session.weights(), x.astype(np.float32)), rtol=1e-4, atol=1e-5)


def test_errors_name_the_callers_shape_and_input(session):
    with pytest.raises(ValueError, match=r"'x'.*\[3, 7\]") as err:
        session.run("infer", {"x": np.zeros((3, 7), np.float32)})
    assert "[6, 7]" not in str(err.value)  # the caller's shape, not the padded batch's
    with pytest.raises(ValueError, match=r"'labels'.*5 rows.*'x'.*4"):
        session.run("train_step", {"x": np.zeros((4, FEATURES), np.float32), "labels": np.zeros(5, np.int64)})
    with pytest.raises(ValueError, match=r"empty"):
        session.run("infer", {"x": np.zeros((0, FEATURES), np.float32)})
    with pytest.raises(ValueError, match=r"label 7 at position 2.*\[0, 4\)"):
        session.run("train_step", {"x": np.zeros((3, FEATURES), np.float32), "labels": np.array([0, 1, 7])})
    with pytest.raises(ValueError, match=r"missing.*'labels'"):
        session.run("train_step", {"x": np.zeros((3, FEATURES), np.float32)})
    with pytest.raises(ValueError, match=r"no input named 'y'"):
        session.run("infer", {"x": np.zeros((3, FEATURES), np.float32), "y": np.zeros(3)})
