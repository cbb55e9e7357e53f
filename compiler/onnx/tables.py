"""The importer's op tables: FOLD (all inputs known: numpy) and BUILD (graph ops)."""
from .build_attention import BUILD_ATTENTION
from .build_index import BUILD_INDEX, INT_OK_INDEX, PARAM_INPUTS_INDEX
from .build_extra_math import BUILD_EXTRA_MATH, EXTRA_MATH_INT_OK, EXTRA_MATH_PARAM_INPUTS
from .build_layers import BUILD_LAYERS
from .build_math import BUILD_MATH
from .build_nn import BUILD_NN
from .build_quant import BUILD_QUANT, QUANT_INT_OK
from .build_sample import BUILD_SAMPLE, PARAM_INPUTS_SAMPLE
from .build_seq import BUILD_SEQ, SEQ_INT_OK, SEQ_PARAM_INPUTS
from .build_signal import BUILD_SIGNAL, SIGNAL_PARAM_INPUTS
from .build_tensor import BUILD_TENSOR, INT_OK, PARAM_INPUTS
from .fold import FOLD  # noqa: F401

BUILD = {**BUILD_MATH, **BUILD_NN, **BUILD_TENSOR, **BUILD_LAYERS}
BUILD.update(BUILD_INDEX, **BUILD_SAMPLE)
INT_OK = INT_OK | INT_OK_INDEX
PARAM_INPUTS = {**PARAM_INPUTS, **PARAM_INPUTS_INDEX, **PARAM_INPUTS_SAMPLE}
BUILD.update({**BUILD_SEQ, **BUILD_SIGNAL})
INT_OK = INT_OK | SEQ_INT_OK
PARAM_INPUTS = {**PARAM_INPUTS, **SEQ_PARAM_INPUTS, **SIGNAL_PARAM_INPUTS}
BUILD.update(BUILD_ATTENTION)
# (last: its BatchNormalization adds training mode and hands the other modes to BUILD_NN's)
BUILD.update(BUILD_EXTRA_MATH)
INT_OK = INT_OK | EXTRA_MATH_INT_OK
PARAM_INPUTS = {**PARAM_INPUTS, **EXTRA_MATH_PARAM_INPUTS}
BUILD.update(BUILD_QUANT)  # (after BUILD_MATH: its Cast / CastLike hand the wide types to BUILD_MATH's)
INT_OK = INT_OK | QUANT_INT_OK
