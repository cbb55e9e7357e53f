"""Meganeura: an embeddable neural-network runtime for game and XR engines.

The subpackages live in the repo's top-level folders (see pyproject.toml):
meganeura.compiler -> compiler/, meganeura.runtime -> runtime/,
meganeura.engine_bridge -> engine_bridge/, meganeura.demos -> demos/.
"""

__version__ = "0.1.0"
