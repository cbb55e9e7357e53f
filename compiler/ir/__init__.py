"""The IR: graphs of ops, the op table, autodiff, the builder, the reference interpreter.

The op table (ops.OPS) is filled by its row modules as they are imported: the core rows in
ops.py, then the neural-network, layer and optimizer rows. Importing anything from this
package imports them all, so OPS is whole wherever it is read.
"""
from . import ops, ops_int, ops_layers, ops_nn, ops_optim  # noqa: F401  (each registers its rows)
from . import ops_index  # noqa: F401  (indexed writes)
from . import ops_math  # noqa: F401  (elementary functions, tensor powers, float remainders)
from . import ops_formats  # noqa: F401  (rounding into narrow number formats)
