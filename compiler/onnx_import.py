"""ONNX -> Model. The importer lives in compiler/onnx/; this module keeps its old name.

    from meganeura.compiler.onnx_import import load_onnx
    model = load_onnx("mlp.onnx", batch_size=64)
"""
from .onnx import load_onnx, supported_ops  # noqa: F401
from .onnx.common import _Known  # noqa: F401
