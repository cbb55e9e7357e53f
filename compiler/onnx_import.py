"""ONNX -> Model, under the module name the README's examples use (the importer: compiler/onnx/).

    from meganeura.compiler.onnx_import import load_onnx
    model = load_onnx("mlp.onnx", batch_size=64)
"""
from .onnx import load_onnx, supported_ops  # noqa: F401
