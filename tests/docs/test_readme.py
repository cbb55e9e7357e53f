"""The README's quickstarts run as written: each `<!-- quickstart: NAME -->` marks the code blocks
up to the next heading; shell lines run the installed `meganeura` command, Python blocks run in
one namespace per README (quickstart 3 continues quickstart 2), in a temporary folder."""
import re
import shlex
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def quickstarts() -> dict:
    """name -> [(language, code)] in README order."""
    out = {}
    for part in re.split(r"(?=<!-- quickstart: )", README)[1:]:
        name = re.match(r"<!-- quickstart: (\w+)", part).group(1)
        body = re.split(r"\n## ", part, maxsplit=1)[0]
        out[name] = BLOCK.findall(body)
    return out


def _meganeura(line: str, cwd: Path):
    exe = Path(sys.executable).with_name("meganeura")
    args = shlex.split(line.split("#", 1)[0])
    assert args[0] == "meganeura", line
    done = subprocess.run([str(exe), *args[1:]], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{line}\n{done.stderr}"
    return done.stdout


def test_the_readme_fits_a_few_screens():
    assert len(README.splitlines()) <= 250
    assert set(quickstarts()) == {"onnx", "bridge", "finetune"}


def test_the_quickstarts_run(tmp_path, device, monkeypatch, capsys):
    sys.path.insert(0, str(ROOT / "examples"))
    import digits

    digits.export_mlp(tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for name, blocks in quickstarts().items():
        for language, code in blocks:
            if language == "sh":
                for line in code.splitlines():
                    if line.strip():
                        out = _meganeura(line, tmp_path)
                        if " info " in f" {line} ":
                            assert "train_step" in out
            elif language == "python":
                exec(compile(code, f"README.md quickstart {name}", "exec"), namespace)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "pixels.safetensors").is_file()
    assert namespace["logits"].shape == (64, 10)
    assert namespace["session"].skipped_steps == 0
    assert "skipped steps: 0" in capsys.readouterr().out
