"""The library as a user installs it: the built wheel in a fresh venv with its base
dependencies only, then `meganeura --version`, `meganeura compile` of an ONNX model and
`meganeura info`. The wheel stays small: no demo weights."""
from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_WHEEL_BYTES = 2 * 1024 * 1024


def _run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{cmd} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    build = tmp_path_factory.mktemp("build")  # a private build folder: never a stale build/lib
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
          str(ROOT)], env={**os.environ, "TMPDIR": str(build)})
    (path,) = dist.glob("meganeura-*.whl")
    return path


def test_wheel_is_small_and_carries_no_demo_weights(wheel):
    assert wheel.stat().st_size <= MAX_WHEEL_BYTES, f"{wheel.stat().st_size} bytes"
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith((".safetensors", ".mnpk", ".onnx"))]
    for room in ("compiler", "runtime", "engine_bridge"):
        assert f"meganeura/{room}/__init__.py" in names
    assert any(n.startswith("meganeura/compiler/codegen/templates/") and n.endswith(".wgsl") for n in names)


def _tiny_onnx(path: Path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "fc.weight")
    b = numpy_helper.from_array(np.zeros(3, np.float32), "fc.bias")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "fc.weight", "fc.bias"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], [w, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_fresh_venv_installs_the_wheel_and_compiles_onnx(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)])
    cli = env_dir / "bin" / "meganeura"
    assert "0.1.0" in _run([str(cli), "--version"])
    _tiny_onnx(tmp_path / "tiny.onnx")
    _run([str(cli), "compile", str(tmp_path / "tiny.onnx"), "-o", str(tmp_path / "tiny.mnpk"), "--train",
          "--loss", "cross_entropy", "--optimizer", "adamw", "--lr", "1e-3"], cwd=tmp_path)
    info = _run([str(cli), "info", str(tmp_path / "tiny.mnpk")], cwd=tmp_path)
    assert "train_step" in info and "fc.weight" in info
    # the installed runtime loads what the installed compiler wrote (no torch, no test extras)
    code = ("import numpy as np; from meganeura.runtime import Package, Session; "
            "import importlib.util as u; assert u.find_spec('torch') is None; "
            f"p = Package.load({str(tmp_path / 'tiny.mnpk')!r}); print(sorted(p.programs))")
    assert "infer" in _run([str(py), "-c", code], cwd=tmp_path)
