"""Packaged model weights: each file comes with the script that made it (see README.md here)."""
