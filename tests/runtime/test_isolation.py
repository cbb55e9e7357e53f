"""The runtime embeds in a game: it loads nothing of the compiler and makes no device at import."""
import subprocess
import sys


def test_runtime_imports_nothing_of_the_compiler():
    code = ("import sys, meganeura.runtime as r; "
            "bad = sorted(m for m in sys.modules if m.startswith(('meganeura.compiler', 'meganeura.engine_bridge'))); "
            "print(bad); assert not bad, bad; "
            "assert 'wgpu' not in sys.modules or not __import__('wgpu').utils.get_default_device.__self__._the_device")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_runtime_sources_never_name_the_compiler():
    from pathlib import Path

    import meganeura.runtime as r

    for path in Path(r.__file__).parent.rglob("*.py"):
        text = path.read_text()
        assert "compiler" not in [w.strip(".,") for line in text.splitlines()
                                  if line.lstrip().startswith(("import ", "from ")) for w in line.split()], path
