"""Package discovery for the package-dir mapping in pyproject.toml.

setuptools' `packages.find` cannot prefix the names it finds, so this file lists
`meganeura` plus every room in [tool.setuptools.package-dir] and each subpackage
(every folder below it, with or without __init__.py, so that data-only folders such as
runtime/wgsl ship their *.wgsl files), e.g. compiler/kernels -> meganeura.compiler.kernels.
All other metadata lives in pyproject.toml.
"""

import os

from setuptools import find_namespace_packages, setup
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


class _MeganeuraDistribution(Distribution):
    def parse_config_files(self, *args, **kwargs):
        super().parse_config_files(*args, **kwargs)  # applies pyproject.toml
        packages = []
        for name, folder in sorted((self.package_dir or {}).items()):
            if name.split(".")[0] != "meganeura":
                continue
            path = os.path.join(HERE, folder)
            if not os.path.isdir(path):
                continue  # e.g. assets/ before any model is shipped
            packages.append(name)
            subs = find_namespace_packages(path, exclude=["*__pycache__*", "*.egg-info*"])
            packages += [f"{name}.{sub}" for sub in subs]
        self.packages = packages


setup(distclass=_MeganeuraDistribution)
