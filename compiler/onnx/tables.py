"""The importer's op tables: FOLD (all inputs known: numpy) and BUILD (graph ops)."""
from .build_layers import BUILD_LAYERS
from .build_math import BUILD_MATH
from .build_nn import BUILD_NN
from .build_tensor import BUILD_TENSOR, INT_OK, PARAM_INPUTS  # noqa: F401
from .fold import FOLD  # noqa: F401

BUILD = {**BUILD_MATH, **BUILD_NN, **BUILD_TENSOR, **BUILD_LAYERS}
