"""meganeura.compiler: models -> Graph IR -> training program -> WGSL kernels -> package.

The stages live in sub-packages, in the order a model walks them: ir/ (the op table, the
builder, autodiff, the training graph), passes/ (rewrites, scheduling, memory), codegen/
(WGSL), package/ (the file). compile.py runs them; options.py holds every choice."""
from meganeura import __version__  # noqa: F401  (one version for the distribution)

from .compile import compile_graph, compile_model  # noqa: F401
from .ir.builder import Builder, Model, Tensor  # noqa: F401
from .ir.graph import Graph, Node, format_graph  # noqa: F401
from .ir.interpret import run_graph  # noqa: F401
from .ir.training import TrainConfig  # noqa: F401
from .options import CompileOptions  # noqa: F401
