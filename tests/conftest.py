"""Shared fixtures. GPU tests run on whatever adapter wgpu finds (lavapipe in CI).

Under MEGANEURA_REQUIRE_GPU=1 (set by .ci/run) a missing adapter fails the tests;
it never skips them quietly.
"""
import os
import tempfile

import pytest

if not os.path.isdir(os.environ.get("XDG_RUNTIME_DIR", "")):  # before wgpu loads
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="meganeura-xdg-")
REQUIRE_GPU = os.environ.get("MEGANEURA_REQUIRE_GPU") == "1"


# scripts/test.sh spreads the files over two workers: the longest ones start first, so that
# none of them begins last and keeps one worker busy after the other has finished
LONGEST_FIRST = ("demos/test_dinovision.py", "engine_bridge/test_soak.py", "compiler/test_onnx_backend.py",
                 "runtime/test_package_fuzz_lifted.py", "runtime/test_checkpoint.py", "packaging/test_wheel.py",
                 "compiler/test_onnx_zoo.py", "runtime/test_package_fuzz.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0].removeprefix("tests/"), len(rank)))

@pytest.fixture(scope="session")
def device():
    """The shared default device, as the runtime gets it with Session(None, ...)."""
    import wgpu

    from meganeura.runtime.device import default_device

    try:
        dev = default_device()
        backend = dev.adapter.info["backend_type"]
    except Exception as exc:  # no adapter at all
        dev, backend, why = None, None, f"{type(exc).__name__}: {exc}"
    if dev is not None and backend not in ("Vulkan", "Metal", "D3D12"):
        why = f"only a {backend} adapter"  # wgpu's GL fallback is not what we ship on
        dev = None
    if dev is None:
        msg = f"no wgpu GPU adapter ({why}); install mesa-vulkan-drivers libvulkan1"
        if REQUIRE_GPU:
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    assert isinstance(dev, wgpu.GPUDevice)
    return dev


@pytest.fixture(scope="session")
def run_on_gpu(device):
    """run_on_gpu(graph, inputs) -> outputs: compile a Graph and run it on the device."""
    from meganeura.compiler import compile_graph
    from meganeura.runtime import Package, Session

    def run(graph, inputs):
        session = Session(device, Package.from_bytes(compile_graph(graph)))
        return session.run("infer", inputs, check_finite=False)  # op tests feed NaN/inf on purpose

    return run


@pytest.fixture
def cnn_with_size_variants():
    """(model, {"x", "labels"}): three convolutions of different widths, so that their ReLUs and
    ReLU gradients differ only in their lengths (kernels compiler/codegen/lift_sizes.py makes one)."""
    import numpy as np
    from meganeura.compiler import Builder

    rng = np.random.default_rng(4)
    b = Builder()
    h, c_in = b.input("x", (2, 3, 12, 12)), 3
    for i, c in enumerate([8, 16, 16]):
        w = b.param(f"c{i}.weight", (rng.standard_normal((c, c_in, 3, 3)) * 0.2).astype(np.float32))
        h, c_in = b.relu(b.conv2d(h, w, stride=(1, 1), padding=(1, 1, 1, 1))), c
    h = b.linear(b.mean(h, axes=(2, 3)), b.param("fc.weight", (rng.standard_normal((5, c_in)) * 0.2).astype(np.float32)))
    b.output("y", h)
    return b.build(), {"x": rng.standard_normal((2, 3, 12, 12)).astype(np.float32),
                       "labels": rng.standard_normal((2, 5)).astype(np.float32)}


@pytest.fixture
def hold_tuned(monkeypatch):
    """An event the tuned tier's compiles (GpuObjects.pipeline on its pool's threads) wait for; set
    when the test ends, whatever happened, so that no compile thread outlives it. Its `began`
    (an event) is set once one of them waits."""
    import threading

    from meganeura.runtime.gpu_objects import GpuObjects

    gate, real = threading.Event(), GpuObjects.pipeline
    gate.began = threading.Event()

    def held(self, i, k, counted=True):
        if threading.current_thread().name.startswith("meganeura-tuned"):
            gate.began.set()
            assert gate.wait(60)
        return real(self, i, k, counted)
    monkeypatch.setattr(GpuObjects, "pipeline", held)
    yield gate
    gate.set()


@pytest.fixture
def training_state_out_of_memory(monkeypatch):
    """Sessions whose training state cannot be allocated (GPUOutOfMemoryError, as the device
    would say it); everything else is made as usual."""
    from meganeura.runtime import GPUOutOfMemoryError
    from meganeura.runtime.gpu_objects import GpuObjects

    real = GpuObjects.allocate

    def failing(self, which, what, *rest):
        if what == "the training state":
            raise GPUOutOfMemoryError("the training state needs more than this test allows")
        return real(self, which, what, *rest)
    monkeypatch.setattr(GpuObjects, "allocate", failing)


@pytest.fixture(scope="session")
def mlp_training_bytes() -> bytes:
    """A small training package's file (two linear layers, AdamW): the runtime's fault tests'."""
    import numpy as np

    from meganeura.compiler import Builder, TrainConfig, compile_model

    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (8, 12))
    h = b.relu(b.linear(x, b.param("fc1.weight", rng.standard_normal((16, 12))), b.param("fc1.bias", np.zeros(16))))
    b.output("logits", b.linear(h, b.param("fc2.weight", rng.standard_normal((5, 16))), b.param("fc2.bias", np.zeros(5))))
    return compile_model(b.build(), TrainConfig(optimizer="adamw", lr=0.01))
