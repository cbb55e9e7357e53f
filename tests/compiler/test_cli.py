"""The `meganeura` command line: bad arguments exit 2 with one line on stderr, failures
exit 1 with one line, never a traceback; packages are written as a plain open() would."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from meganeura import __version__
from meganeura.compiler.cli import main, parser
from meganeura.runtime import Package

PARAMS = ("head.weight", "head.bias")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny ONNX classifier: x [4, 3] -> Gemm -> logits [4, 5]."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((5, 3)).astype(np.float32), PARAMS[0]),
             numpy_helper.from_array(np.zeros(5, np.float32), PARAMS[1])]
    node = helper.make_node("Gemm", ["x", *PARAMS], ["logits"], transB=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4, 5])], inits)
    path = tmp_path_factory.mktemp("cli") / "tiny.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def refused(capsys, argv, status=2) -> str:
    """Run the command in-process; assert it exits `status` with one line on stderr; return it."""
    assert main(argv) == status
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("option, value", [
    ("--batch", "0"), ("--batch", "-3"), ("--batch", "two"),
    ("--lr", "0"), ("--lr", "-0.1"), ("--lr", "nan"), ("--lr", "inf"),
    ("--weight-decay", "-1"), ("--weight-decay", "nan"),
    ("--clip-norm", "0"), ("--clip-norm", "inf"),
    ("--ignore-index", "1.5"), ("--ignore-index", str(1 << 24)),
])
def test_nonsense_numbers_are_refused(capsys, model, tmp_path, option, value):
    err = refused(capsys, ["compile", str(model), "-o", str(tmp_path / "o.mnpk"), "--train", option, value])
    assert option in err
    assert not (tmp_path / "o.mnpk").exists()


def test_a_weight_decay_of_zero_is_allowed(capsys, model, tmp_path):
    assert main(["compile", str(model), "-o", str(tmp_path / "o.mnpk"), "--train", "--weight-decay", "0"]) == 0


@pytest.mark.parametrize("options", [["--loss", "mse"], ["--optimizer", "sgd"], ["--lr", "0.1"],
                                     ["--weight-decay", "0"], ["--clip-norm", "1"], ["--freeze", "head.*"],
                                     ["--ignore-index", "-1"]])
def test_training_options_need_train(capsys, model, tmp_path, options):
    err = refused(capsys, ["compile", str(model), "-o", str(tmp_path / "o.mnpk"), *options])
    assert options[0] in err and "--train" in err


def test_ignore_index_needs_cross_entropy(capsys, model, tmp_path):
    err = refused(capsys, ["compile", str(model), "-o", str(tmp_path / "o.mnpk"), "--train", "--loss", "mse",
                           "--ignore-index", "3"])
    assert "--ignore-index" in err


def test_a_freeze_glob_matching_no_parameter_is_refused_with_the_names(capsys, model, tmp_path):
    err = refused(capsys, ["compile", str(model), "-o", str(tmp_path / "o.mnpk"), "--train",
                           "--freeze", "head.*", "--freeze", "backbone.*"])
    assert "'backbone.*'" in err and all(p in err for p in PARAMS)
    assert not (tmp_path / "o.mnpk").exists()


def test_ignore_index_reaches_the_manifest_and_the_file_honours_the_umask(capsys, model, tmp_path):
    out = tmp_path / "sub" / "o.mnpk"
    old = os.umask(0o027)
    try:
        assert main(["compile", str(model), "-o", str(out), "--train", "--ignore-index", "4"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert Package.load(out).manifest["training"]["ignore_index"] == 4
    stdout, err = capsys.readouterr()
    assert "wrote" in stdout and err == ""  # no progress bar: stderr is not a terminal here
    assert [p.name for p in out.parent.iterdir()] == ["o.mnpk"]  # no temporary file left behind


def test_a_model_that_cannot_be_read_fails_with_one_line(capsys, tmp_path, monkeypatch):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x0a\xff\xff not protobuf")
    err = refused(capsys, ["compile", str(bad), "-o", str(tmp_path / "o.mnpk")], status=1)
    assert err.startswith("meganeura: cannot compile broken.onnx: ")
    from google.protobuf.message import DecodeError

    monkeypatch.setenv("MEGANEURA_DEBUG", "1")  # a traceback for whoever debugs it
    with pytest.raises(DecodeError):
        main(["compile", str(bad), "-o", str(tmp_path / "o.mnpk")])


def test_version_and_help(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"meganeura {__version__}"
    sub = {a.dest: a for a in parser()._actions if a.dest == "command"}["command"].choices
    for name, p in sub.items():
        for action in p._actions:
            if action.dest != "help":
                assert action.help, (name, action.dest)
            if name == "compile" and action.option_strings and action.dest not in ("help", "output"):
                assert "default" in action.help, action.dest


def test_the_installed_command_refuses_without_a_traceback(model, tmp_path):
    """The console script, after the model is loaded: one line, status 2."""
    exe = Path(sys.executable).with_name("meganeura")
    r = subprocess.run([str(exe), "compile", str(model), "-o", str(tmp_path / "o.mnpk"), "--train",
                        "--freeze", "nothing*"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and r.stdout == "", r
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
