"""The documentation site builds with warnings as errors (mkdocs.yml: strict), and its pages hold
what they promise: the API reference from the docstrings, the plots the benchmarks page shows,
the ONNX coverage and the changelog. scripts/setup.sh installs the `docs` extra."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    try:
        import material  # noqa: F401
        import mkdocstrings_handlers.python  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"the docs extra is missing ({exc}): bash scripts/setup.sh installs it", pytrace=False)
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    return out


def _text(site, page):
    return re.sub(r"<[^>]+>", " ", (site / page / "index.html").read_text())


def test_the_api_reference_comes_from_the_docstrings(site):
    runtime = _text(site, "reference/runtime")
    for name in ("Session", "Package", "InputError", "save_weights", "record", "readback"):
        assert name in runtime, name
    compiler = _text(site, "reference/compiler")
    for name in ("compile_model", "CompileOptions", "TrainConfig", "load_onnx", "Builder", "ignore_index"):
        assert name in compiler, name
    bridge = _text(site, "reference/engine-bridge")
    for name in ("FrameScheduler", "TextureInput", "TensorOverlay", "OffscreenHost", "budget_ms"):
        assert name in bridge, name


def test_the_guides_and_their_pictures(site):
    for page in ("guides/engine-bridge", "guides/training", "PACKAGE", "ONNX", "benchmarks", "changelog"):
        assert (site / page / "index.html").is_file(), page
    bench = (site / "benchmarks" / "index.html").read_text()
    plots = re.findall(r'src="([^"]+\.svg)"', bench)
    assert plots, "the benchmarks page shows no plots"
    for src in plots:
        assert (site / "benchmarks" / src).resolve().is_file(), src
    assert "Keep a Changelog" in _text(site, "changelog")
    assert "dinovision.png" in (site / "index.html").read_text()


def test_the_pages_speak_of_the_project_only():
    """No working history in the docs: numbered work periods, calls, rounds."""
    pattern = re.compile(r"\b(call|round|period|session) \d+\b|\bwork(ing)? (period|history)\b", re.IGNORECASE)
    pages = sorted((ROOT / "docs").rglob("*.md"))
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages for m in pattern.finditer(p.read_text())]
    assert not hits, hits
