"""ONNX import (see importer.py and docs/ONNX.md)."""
from .importer import load_onnx, supported_ops  # noqa: F401
