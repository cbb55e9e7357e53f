"""The importer's op tables: FOLD (all inputs known: numpy) and BUILD (graph ops)."""
from .build_math import BUILD_MATH
from .build_nn import BUILD_NN
from .build_tensor import BUILD_TENSOR, INT_OK  # noqa: F401
from .fold import FOLD  # noqa: F401

BUILD = {**BUILD_MATH, **BUILD_NN, **BUILD_TENSOR}
