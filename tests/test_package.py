"""What importing the package does and does not do: the runtime and its command lines without
torch or fairseq (installed or not), the process's excepthook left alone, no library module
importing the command lines, help texts that hold under python -OO."""

import ast
import os
import subprocess
import sys

import pytest
from conftest import BIN, PLUGIN_DIR, clean_env

HEAVY = ("torch", "fairseq")


def python(code, *args, flags=()):
    return subprocess.run([sys.executable, *flags, "-c", code, *args], env=clean_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)


def test_runtime_leaves_torch_and_fairseq_unimported_where_they_are_installed():
    """Both are installed in the test environment; the runtime must not pull them in."""
    modules = ["fairseq_memattn", "fairseq_memattn.deploy", "fairseq_memattn.cli.translate"]
    try:
        import aiohttp  # noqa: F401

        modules += ["fairseq_memattn.deploy.serve", "fairseq_memattn.cli.serve"]
    except ImportError:
        pass
    code = f"""
import importlib, sys
for name in {modules!r}:
    importlib.import_module(name)
from fairseq_memattn.cli.translate import main
try:
    main(["--help"])
except SystemExit:
    pass
print(sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r}))
"""
    result = python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_console_scripts_import_only_the_standard_library_before_main():
    """A Ctrl-C in a console script's first moments must land in its main, which exits quietly
    (status 130): importing the module main is in imports nothing heavier than the standard library."""
    code = """
import sys
before = set(sys.modules)
import fairseq_memattn.cli.translate, fairseq_memattn.cli.serve
print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)))
"""
    result = python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "['fairseq_memattn']"


def test_translate_console_script_imports_neither_torch_nor_fairseq():
    env = clean_env(PYTHONPROFILEIMPORTTIME="1")
    result = subprocess.run([os.path.join(BIN, "fairseq-memattn-translate"), "--help"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "usage: fairseq-memattn-translate" in result.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "fairseq_memattn.cli.translate" in imported
    assert not {name for name in imported if name.split(".")[0] in HEAVY}


def test_importing_the_package_leaves_the_excepthook_alone():
    """Also with fairseq imported first, where the package registers with it."""
    code = """
import sys
hook = sys.excepthook
import fairseq
import fairseq_memattn
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq_memattn.models import lstm_memattn
fairseq_memattn.register()
assert "lstm_memattn" in ARCH_MODEL_REGISTRY and "transformer_memattn" in ARCH_MODEL_REGISTRY
assert sys.excepthook is hook, sys.excepthook
print("ok")
"""
    result = python(code)
    assert result.stdout == "ok\n", result.stderr[-2000:]


def test_register_says_which_fairseq_to_install(tmp_path):
    """With a fairseq that is installed but does not import (PyPI's 0.12.2 on Python 3.11),
    registering says which extra to install; importing the package alone does not need it."""
    broken = tmp_path / "fairseq"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ValueError('mutable default for field common')\n")
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    run = lambda code: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,  # noqa: E731
                                      text=True, timeout=120)
    assert run("import fairseq_memattn.deploy").returncode == 0
    result = run("import fairseq_memattn; fairseq_memattn.register()")
    assert result.returncode != 0 and "pip install ve-fairseq==0.12.3" in result.stderr


# A user's program (not a command line) that catches our error, then fails on its own.
USER_SCRIPT = """
import sys
{setup}
import fairseq
import fairseq_memattn
from fairseq_memattn.score import read_generate_output
try:
    read_generate_output([])
except ValueError:
    {then}
"""


@pytest.mark.parametrize("then, last", [
    ("undefined_name", "NameError: name 'undefined_name' is not defined"),
    ("raise KeyboardInterrupt", "KeyboardInterrupt"),
    ("raise RuntimeError('mine') from None", "RuntimeError: mine"),
])
@pytest.mark.parametrize("where", ["a user's program", "fairseq's command line"])
def test_an_error_that_is_not_ours_keeps_its_traceback(then, last, where):
    """Even where the one-line hook is installed (a fairseq command line loading the plugin)."""
    setup = "sys.argv[0] = 'fairseq-generate'" if where == "fairseq's command line" else ""
    result = python(USER_SCRIPT.format(setup=setup, then=then))
    assert "Traceback" in result.stderr and result.stderr.strip().splitlines()[-1] == last, result.stderr


def test_ours_is_one_line_in_fairseq_command_lines_only():
    script = USER_SCRIPT.format(setup="{setup}", then="raise")
    line = "fairseq-generate: error: no T- (reference) lines: fairseq-generate prints them"
    cli = python(script.format(setup="sys.argv[0] = '/bin/fairseq-generate'"))
    assert "Traceback" not in cli.stderr and cli.stderr.strip().splitlines()[-1].startswith(line), cli.stderr
    program = python(script.format(setup=""))
    assert "Traceback" in program.stderr and "fairseq_memattn.errors.UserError: no T-" in program.stderr


def test_no_library_module_imports_the_command_lines():
    """cli/ is the top: a library module (and its python -m run) never imports it; a package's
    __main__.py is a command line itself."""
    offenders = []
    for root, _, names in os.walk(PLUGIN_DIR):
        for name in names:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, PLUGIN_DIR)
            if not name.endswith(".py") or name == "__main__.py" or relative.startswith("cli" + os.sep):
                continue
            package = ["fairseq_memattn", *os.path.dirname(relative).split(os.sep)]
            package = [part for part in package if part]
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                if isinstance(node, ast.ImportFrom):
                    base = package[: len(package) - node.level + 1] if node.level else []
                    targets = [".".join([*base, node.module or ""]).strip(".")]
                    targets += [f"{targets[0]}.{alias.name}" for alias in node.names]
                elif isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                else:
                    continue
                if any(t == "fairseq_memattn.cli" or t.startswith("fairseq_memattn.cli.") for t in targets):
                    offenders.append(f"{relative}:{node.lineno}")
    assert offenders == []


@pytest.mark.parametrize("module, words", [
    ("fairseq_memattn.cli.export", "ONNX Runtime"),
    ("fairseq_memattn.export", "ONNX Runtime"),
    ("fairseq_memattn.cli.convert", "--memory-k K"),
    ("fairseq_memattn.cli.score", "--reference FILE"),
    ("fairseq_memattn.cli.translate", "byte order mark"),
    ("fairseq_memattn.cli.serve", "POST /translate"),
])
def test_help_works_under_python_OO(module, words):
    """python -OO drops docstrings: help texts are written in the command lines themselves."""
    result = subprocess.run([sys.executable, "-OO", "-m", module, "--help"], env=clean_env(OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and words in result.stdout, result.stderr[-2000:]
