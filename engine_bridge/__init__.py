"""meganeura.engine_bridge: hosts, texture<->tensor kernels and the frame scheduler."""
