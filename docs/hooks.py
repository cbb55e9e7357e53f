"""mkdocs hook: lay the import names out for griffe, which reads the source without importing it.

The distribution maps `meganeura.runtime` onto the folder `runtime/` (and so on, see
pyproject.toml's package-dir); griffe looks packages up by folder. The hook links
build/docs-src/meganeura/<room> to each room, so `::: meganeura.runtime.Session` finds
runtime/session.py.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "docs-src"


def on_startup(command, dirty, **kwargs):
    """Before any plugin reads its configuration: mkdocstrings takes its search paths as they
    exist then, so the links must be there on a fresh checkout's first build."""
    link_rooms()


def on_config(config, **kwargs):
    link_rooms()
    return config


def link_rooms() -> None:
    table = re.search(r"^\[tool\.setuptools\.package-dir\]\n(.*?)(?=^\[|\Z)",
                      (ROOT / "pyproject.toml").read_text(), re.DOTALL | re.MULTILINE).group(1)
    mapping = dict(re.findall(r'^"([\w.]+)" = "([^"]+)"', table, re.MULTILINE))
    top = TREE / "meganeura"
    top.mkdir(parents=True, exist_ok=True)
    links = {"__init__.py": ROOT / mapping["meganeura"] / "__init__.py"}
    links.update({name.split(".", 1)[1]: ROOT / folder for name, folder in mapping.items() if "." in name})
    for name, target in links.items():
        link = top / name
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target, target_is_directory=target.is_dir())
