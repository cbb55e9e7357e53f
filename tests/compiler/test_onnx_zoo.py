"""A fast subset of the real-architecture sweep (tests/compiler/onnx_zoo.py): exported from
torch, imported, compiled, run on the GPU for inference and three training steps, against
torch on the CPU in float64."""
import onnx_zoo  # (tests/compiler is on sys.path: rootdir-relative test modules; the test extra has transformers)
import pytest

CASES = [("bert", "torchscript"), ("llama", "dynamo"), ("convnext", "torchscript"), ("gru", "dynamo")]


@pytest.mark.parametrize("name,exporter", CASES, ids=[f"{n}-{e}" for n, e in CASES])
def test_zoo_model_matches_torch(name, exporter, device):
    r = onnx_zoo.run(name, exporter, steps=3, device=device)
    assert r["infer"] < 1e-4, r
    assert r["train"] < 1e-4, r
