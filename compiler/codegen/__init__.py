"""Kernels: a schedule's kernels as WGSL, from templates and tile plans."""
