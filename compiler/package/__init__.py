"""Writing the package file: manifest, kernels, weights."""
