"""meganeura.demos: demo applications (the flagship is demos/dinovision)."""
