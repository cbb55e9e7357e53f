"""meganeura.compiler: models -> Graph IR -> training program -> WGSL kernels -> package."""
__version__ = "0.1.0"

from .builder import Builder, Model, Tensor  # noqa: E402,F401
from .compile import compile_graph, compile_model  # noqa: E402,F401
from .interpret import run_graph  # noqa: E402,F401
from .ir import Graph, Node, format_graph  # noqa: E402,F401
from .training import TrainConfig  # noqa: E402,F401
