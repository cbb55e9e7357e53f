"""Rewrites and planning on graphs: prepare, schedule, reductions, memory, half weights."""
