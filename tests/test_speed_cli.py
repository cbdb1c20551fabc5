"""recipes/speed's command lines refuse what they cannot do in argparse's one line, before any model
is built, converted or timed; what they reuse from an earlier run (a --workdir's models, an --out's
or --rows's times) is what this run asks for."""

import argparse
import importlib.util
import json
import os
import subprocess

import pytest

from recipes.speed import (benchmark, deploy, overview_plot, parallel, profile_export, report, serve,
                           transformer_decode)

DECODE_HEADER = "model,label,L,sources,beam,repeats,seconds,ms_per_step,bytes_per_hypothesis\n"


def refusal(main, argv, capsys):
    """The error line of a command line that refuses argv (status 2)."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "afile"
    path.write_text("x\n")
    return path


# --- benchmark ------------------------------------------------------------------------

def test_benchmark_bad_options_are_named(tmp_path, a_file, capsys):
    out = str(tmp_path)
    error = refusal(benchmark.main, ["--out", out, "--models", "k3"], capsys)
    assert "unknown --models k3" in error and "k32" in error
    assert refusal(benchmark.main, ["--out", out, "--lengths", "0"], capsys).endswith(
        "argument --lengths: invalid value 0 (must be an integer >= 1)")
    # at least one measurement per cell: 0 s would leave none to take the median of
    assert refusal(benchmark.main, ["--out", out, "--max-cell-seconds", "0"], capsys).endswith(
        "argument --max-cell-seconds: invalid value 0 (must be a finite number > 0)")
    assert refusal(benchmark.main, ["--out", out, "--min-cell-seconds", "-1"], capsys).endswith(
        "invalid --min-cell-seconds: -1.0 (must be >= 0)")
    assert refusal(benchmark.main, ["--out", str(a_file)], capsys).endswith(
        f"argument --out: {a_file}: {a_file} is a file, not a folder")
    # a value twice would be timed twice, and one of the two rows reported
    assert refusal(benchmark.main, ["--out", out, "--models", "k1", "noatt", "k1"], capsys).endswith(
        "argument --models: k1 given more than once")
    assert refusal(benchmark.main, ["--out", out, "--lengths", "2", "2"], capsys).endswith(
        "argument --lengths: 2 given more than once")
    assert refusal(benchmark.main, ["--out", out, "--min-cell-seconds", "10", "--max-cell-seconds", "1"],
                   capsys).endswith("--min-cell-seconds 10 is more than --max-cell-seconds 1")


def test_benchmark_does_not_add_to_a_table_measured_with_other_settings(tmp_path, capsys):
    """Times of beam 30 and beam 4 in one table would be reported under one heading."""
    (tmp_path / "decode.csv").write_text(DECODE_HEADER + "noatt,No Att,4,3,30,1,0.1,1.0,100\n")
    assert refusal(benchmark.main, ["--out", str(tmp_path), "--beam", "4", "--sources", "3"], capsys).endswith(
        f"{tmp_path / 'decode.csv'} holds times measured with other settings: --beam 30 (now 4); give another --out")
    # settings.json, which each run writes before measuring, holds what the CSV does not
    (tmp_path / "settings.json").write_text('{"decode": {"sources": 3, "batch_size": 2, "beam": 30, "threads": 1}}')
    assert refusal(benchmark.main, ["--out", str(tmp_path), "--beam", "30", "--sources", "3"], capsys).endswith(
        "other settings: --batch-size 2 (now 20); give another --out")
    # a run that adds no decoding times is not held to their settings
    args = benchmark.parse_args(["--out", str(tmp_path), "--lengths", "--train-batch-size", "4"])
    assert args.settings["train"] == {"train_batch_size": 4, "threads": 1}


def test_transformer_decode_refuses_a_run_that_would_time_nothing(capsys):
    assert refusal(transformer_decode.main, ["--max-cell-seconds", "nan"], capsys).endswith(
        "invalid --max-cell-seconds: nan (must be a finite number)")
    assert refusal(transformer_decode.main, ["--max-cell-seconds", "-5"], capsys).endswith(
        "invalid --max-cell-seconds: -5.0 (must be >= 0)")
    assert refusal(transformer_decode.main, ["--source-lens", "--copy-lens", "--train-len", "0"], capsys).endswith(
        "nothing to time: give lengths to --source-lens or --copy-lens, or a --train-len")
    assert refusal(transformer_decode.main, ["--copy-lens", "50", "50"], capsys).endswith(
        "argument --copy-lens: 50 given more than once")


# --- the reports' files ---------------------------------------------------------------

def test_an_output_file_gets_its_folder_before_the_work(tmp_path, a_file, capsys):
    args = transformer_decode.parse_args(["--out", str(tmp_path / "new" / "t.md")])
    assert args.out == str(tmp_path / "new" / "t.md") and (tmp_path / "new").is_dir()
    assert profile_export.parser().parse_args(["EXPORT", "--out", str(tmp_path / "p" / "p.md")]).out
    assert (tmp_path / "p").is_dir()
    blocked = f"argument --out: {a_file / 't.md'}: {a_file} is a file, not a folder"
    assert refusal(transformer_decode.main, ["--out", str(a_file / "t.md")], capsys).endswith(blocked)
    assert refusal(profile_export.main, ["EXPORT", "--out", str(a_file / "t.md")], capsys).endswith(blocked)


def test_overview_plot_refuses_what_is_not_a_decode_csv_or_an_image(tmp_path, capsys):
    csv = tmp_path / "decode.csv"
    csv.write_text(DECODE_HEADER + "k32,K=32,10,20,10,3,0.1,1.0,100\nk32,K=32,100,20,10,3,0.2,1.0,100\n")
    error = refusal(overview_plot.main, [str(csv), str(tmp_path / "x.pgn")], capsys)
    allowed = error.split(f"argument output: {tmp_path / 'x.pgn'}: give an image file ending in one of ")[1]
    assert {".png", ".svg", ".pdf"} <= set(allowed.split(", "))
    assert refusal(overview_plot.main, [str(tmp_path), "x.png"], capsys).endswith(
        f"argument csv: {tmp_path}: a folder, not a file")
    speed_md = tmp_path / "speed.md"
    speed_md.write_text("Made by `python -m recipes.speed.benchmark --out x`.\n\n### Decoding\n")
    assert refusal(overview_plot.main, [str(speed_md), "x.png"], capsys).endswith(
        f"{speed_md}: not a decode.csv of recipes.speed.benchmark (no column model, label, L, sources, beam, "
        "seconds, ms_per_step, bytes_per_hypothesis)")
    for row in ("k32,K=32,10,20,10,3,fast,1.0,100", "k32,K=32,10,20,10,3,nan,1.0,100"):  # nan: no log scale
        broken = tmp_path / "broken.csv"
        broken.write_text(DECODE_HEADER + row + "\n")
        assert refusal(overview_plot.main, [str(broken), "x.png"], capsys).endswith(
            f"{broken}: line 2 is not a row of recipes.speed.benchmark's numbers")
    garbage = tmp_path / "garbage"
    (garbage / "decode.csv").parent.mkdir()
    (garbage / "decode.csv").write_text("garbage\n")  # a header alone, and not benchmark's
    assert refusal(report.main, [str(garbage)], capsys).endswith("(no column model, label, L, sources, beam, "
                                                                "seconds, ms_per_step, bytes_per_hypothesis)")
    assert not (garbage / "speed.md").exists()
    assert not (tmp_path / "x.png").exists()
    overview_plot.main([str(csv), str(tmp_path / "nodir" / "x.png")])  # its folder made, not a late crash
    assert (tmp_path / "nodir" / "x.png").stat().st_size > 0


# --- the export's recipes: profile_export, serve, parallel -----------------------------

@pytest.mark.parametrize("option", ["--sources", "--beam", "--source-len", "--target-len", "--threads"])
def test_profile_export_refuses_counts_below_one(option, capsys):
    assert refusal(profile_export.main, ["EXPORT", option, "0"], capsys).endswith(
        f"argument {option}: invalid value 0 (must be an integer >= 1)")


@pytest.mark.parametrize("argv, message", ids=["sentences", "clients", "workers", "lengths", "window", "seed",
                                                "clients-twice"], argvalues=[
    (["--sentences", "0"], "argument --sentences: invalid value 0 (must be an integer >= 1)"),
    (["--clients", "4", "0"], "argument --clients: invalid value 0 (must be an integer >= 1)"),
    (["--workers", "0"], "argument --workers: invalid value 0 (must be an integer >= 1)"),
    (["--lengths", "10", "2"], "invalid --lengths: 10 2 (MIN must be <= MAX)"),
    (["--batch-window-ms", "-5"], "invalid --batch-window-ms: -5.0 (must be >= 0)"),
    (["--seed", "-1"], "argument --seed: invalid value -1 (must be an integer >= 0)"),
    (["--clients", "2", "2"], "argument --clients: 2 given more than once"),
])
def test_serve_refuses_bad_numbers(argv, message, capsys):
    assert refusal(serve.main, ["EXPORT", *argv], capsys).endswith(message)


@pytest.mark.parametrize("argv, message", ids=["cores", "repeats", "ct2"], argvalues=[
    (["--cores", "0"], "argument --cores: invalid value 0 (must be an integer >= 1)"),
    (["--repeats", "0"], "argument --repeats: invalid value 0 (must be an integer >= 1)"),
    (["--ct2", "."], "argument --ct2: .: no model.bin in it"),
])
def test_parallel_refuses_bad_options(argv, message, a_file, capsys):
    assert refusal(parallel.main, ["--export", "EXPORT", "--input", str(a_file), *argv], capsys).endswith(message)


def hide(monkeypatch, module):
    """importlib.util.find_spec as where MODULE is not installed."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == module
                        else find_spec(name, *rest))


def test_serve_asks_for_aiohttp_before_any_work_where_it_is_not_installed(monkeypatch, capsys):
    hide(monkeypatch, "aiohttp")
    assert refusal(serve.main, ["EXPORT"], capsys).endswith(
        'error: the server and its clients need aiohttp: pip install "aiohttp>=3.9"')


def test_ctranslate2_is_asked_for_before_any_work_where_it_is_not_installed(tmp_path, a_file, monkeypatch, capsys):
    hide(monkeypatch, "ctranslate2")
    (tmp_path / "ct2").mkdir()
    (tmp_path / "ct2" / "model.bin").write_text("x")
    assert refusal(parallel.main, ["--ct2", str(tmp_path / "ct2"), "--input", str(a_file)], capsys).endswith(
        "error: --ct2 needs CTranslate2, which is not installed: pip install ctranslate2")
    grid = ["--engines", "ct2-f32", "onnx-f32", "ct2-int8", "--source-lens", "5", "--copy-lens", "--threads", "1"]
    assert refusal(deploy.main, [*grid, "--workdir", str(tmp_path / "work")], capsys).endswith(
        "error: --engines ct2-f32 ct2-int8 needs CTranslate2, which is not installed: pip install ctranslate2, "
        "or leave them out of --engines")
    assert not (tmp_path / "work").exists()


def test_a_ctranslate2_folder_it_cannot_load_is_one_line(tmp_path, a_file, capsys):
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional engine")
    (tmp_path / "model.bin").write_text("not a model")
    assert f"error: argument --ct2: {tmp_path}: CTranslate2 cannot load it (" in refusal(
        parallel.main, ["--ct2", str(tmp_path), "--input", str(a_file)], capsys)


def test_a_missing_or_wrong_export_folder_is_one_line(tmp_path, a_file, capsys):
    """The library's ModelFolderError, which names the folder, instead of its traceback."""
    pytest.importorskip("onnxruntime")
    for folder, reason in ((tmp_path / "none", "no such folder"), (a_file, "a file, not a folder"),
                           (tmp_path, "no config.json")):
        message = f"error: not an exported model folder ({reason}): {folder}"
        assert refusal(profile_export.main, [str(folder)], capsys).endswith(message)
        assert refusal(serve.main, [str(folder)], capsys).endswith(message)
        assert refusal(parallel.main, ["--export", str(folder), "--input", str(a_file)], capsys).endswith(message)


def test_parallel_workers_find_relative_paths(tmp_path, monkeypatch, capsys):
    """Workers start in the caller's folder: a relative --input or --export means the same there."""
    (tmp_path / "in.en").write_text("a b\n")
    (tmp_path / "export").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(parallel, "load_export", lambda p, folder: None, raising=False)
    seen = []

    def worker(command, cwd=None, **_):
        seen.append(os.path.isfile(os.path.join(cwd or os.getcwd(), command[command.index("--input") + 1])))
        row = {"seconds": 1.0, "output_tokens": 2, "sentences": 1}
        return subprocess.CompletedProcess(command, 0, stdout=json.dumps(row))

    monkeypatch.setattr(parallel.subprocess, "run", worker)
    parallel.main(["--export", "export", "--input", "in.en"])
    assert seen == [True] * 3
    parallel.main(["--export", "export", "--input", "in.en", "--out", "nodir/p.md"])
    assert (tmp_path / "nodir" / "p.md").exists()
    assert refusal(parallel.main, ["--export", "export", "--input", "afile.en"], capsys).endswith(
        "argument --input: afile.en: no such file")
    (tmp_path / "empty.en").write_text("\n")
    assert refusal(parallel.main, ["--export", "export", "--input", "empty.en"], capsys).endswith(
        "--input empty.en: no sentences in it")
    (tmp_path / "latin1.en").write_bytes("caf\xe9\n".encode("latin-1"))
    assert "--input latin1.en: not UTF-8 text (" in refusal(parallel.main, ["--export", "export", "--input",
                                                                          "latin1.en"], capsys)


# --- deploy ---------------------------------------------------------------------------

GRID = ["--engines", "memattn", "--source-lens", "5", "--copy-lens", "--target-len", "3", "--threads", "1"]


@pytest.mark.parametrize("argv, message", ids=["repeats", "cell-seconds", "no-cells", "threads", "no-data",
                                                "no-checkpoint", "threads-twice", "engines-twice"], argvalues=[
    (["--repeats", "0"], "argument --repeats: invalid value 0 (must be an integer >= 1)"),
    (["--cell-seconds", "0"], "argument --cell-seconds: invalid value 0 (must be a finite number > 0)"),
    (["--source-lens", "--copy-lens"], "no cells to time: give lengths to --source-lens or --copy-lens (or --trained)"),
    (["--threads"], "argument --threads: expected at least one argument"),
    (["--trained", __file__, __file__], "--trained needs --data, the folder with its test split and dictionaries"),
    (["--trained", "/nonexistent1.pt", __file__], "argument --trained: /nonexistent1.pt: no such file"),
    (["--threads", "1", "1"], "argument --threads: 1 given more than once"),
    (["--engines", "memattn", "memattn"], "argument --engines: memattn given more than once"),
])
def test_deploy_refuses_bad_options(argv, message, tmp_path, capsys):
    assert refusal(deploy.main, [*GRID, "--workdir", str(tmp_path), *argv], capsys).endswith(message)


def test_deploy_refuses_rows_measured_with_other_settings(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    argv = [*GRID, "--workdir", str(tmp_path), "--rows", str(rows)]
    settings = {"trained": None, "size": "small", "vocab": 20, "memory_k": 4, "sources": 20, "beam": 5, "split": False}
    row = {"engine": "memattn", "threads": 1, "S": 5, "T": 3, "seconds": 0.1, "peak_mib": 300, "round": 0,
           "settings": settings}
    rows.write_text(json.dumps(row) + "\n")
    assert refusal(deploy.main, [*argv, "--memory-k", "8"], capsys).endswith(
        f"--rows {rows} holds times measured with other settings: --memory-k 4 (now 8); give another --rows")
    assert deploy.parse_args([*argv, "--memory-k", "4"]).earlier_rows == [row]
    rows.write_text("Made by ...\n")
    assert refusal(deploy.main, argv, capsys).endswith(f"--rows {rows}: line 1 is not a row of recipes.speed.deploy")


def test_deploy_times_the_models_of_this_run_in_a_shared_workdir(tmp_path):
    """A --workdir's model is reused only where it was made from the same options: K = 8 after K = 4
    is a model of K = 8."""
    import torch

    def memory_k(*argv):
        paths = deploy.prepare(deploy.parse_args([*GRID, "--workdir", str(tmp_path), *argv]))
        return torch.load(os.path.join(paths["memattn"], "checkpoint.pt"), weights_only=False)["args"].memory_k

    assert memory_k("--memory-k", "4") == 4
    assert memory_k("--memory-k", "8") == 8
    assert memory_k("--memory-k", "4") == 4


def test_deploy_links_the_trained_checkpoints_of_this_run(tmp_path, monkeypatch):
    """--trained C D after --trained A B times C and D; a checkpoint rewritten in place is converted again."""
    checkpoints = {}
    for name in "ABCD":
        checkpoints[name] = tmp_path / f"{name}.pt"
        checkpoints[name].write_text(name)
    data = tmp_path / "data"
    (data / "data-bin").mkdir(parents=True)
    converted = []
    monkeypatch.setattr(deploy, "convert_and_export", lambda args, paths, data_dir: converted.append(
        {name: os.path.exists(os.path.join(folder, "onnx-f32")) for name, folder in paths.items()}))

    def linked(*names):
        args = argparse.Namespace(trained=[str(checkpoints[n]) for n in names], data=str(data),
                                  workdir=str(tmp_path / "work"))
        paths = deploy.prepare_trained(args)
        return [open(os.path.join(paths[model], "checkpoint.pt")).read() for model in ("transformer", "memattn")]

    assert linked("A", "B") == ["A", "B"]
    os.mkdir(tmp_path / "work" / "trained-memattn" / "onnx-f32")  # B's export
    assert linked("C", "D") == ["C", "D"] and converted[-1] == {"transformer": False, "memattn": False}
    assert linked("C", "D") == ["C", "D"]
    os.mkdir(tmp_path / "work" / "trained-memattn" / "onnx-f32")  # D's export
    assert linked("C", "D") == ["C", "D"] and converted[-1]["memattn"]  # kept: made from D
    checkpoints["D"].write_text("D, trained further")
    assert linked("C", "D") == ["C", "D, trained further"] and not converted[-1]["memattn"]



def test_deploy_workers_find_relative_paths(tmp_path, monkeypatch):
    """A worker reads --data itself: it starts in the caller's folder, where a relative path means the same."""
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    seen = []

    class Worker:
        def __init__(self, command, cwd=None, **_):
            seen.append(os.path.isdir(os.path.join(cwd or os.getcwd(), command[command.index("--data") + 1])))
            self.stdout = [json.dumps({"engine": "memattn", "threads": 1, "S": 0, "T": 0, "seconds": 1.0})]

        def wait(self):
            return 0

    monkeypatch.setattr(deploy.subprocess, "Popen", Worker)
    [row] = deploy.measure("memattn", 1, str(tmp_path / "work"), [(0, 0)], ["--data", "data"], None, {})
    assert seen == [True] and row["seconds"] == 1.0


def test_deploy_refuses_trained_checkpoints_it_cannot_time_as_named(tmp_path, capsys):
    """A checkpoint in the other's place would be timed under the other's name; a file that is no
    checkpoint would fail in the converter."""
    paths = deploy.prepare(deploy.parse_args([*GRID, "--workdir", str(tmp_path / "work")]))
    transformer, memattn = (os.path.join(paths[name], "checkpoint.pt") for name in ("transformer", "memattn"))
    data = tmp_path / "data"
    for part in ("bpe/test.en", "data-bin/dict.en.txt"):
        (data / part).parent.mkdir(parents=True, exist_ok=True)
        (data / part).write_text("4 1\n")
    argv = ["--engines", "memattn", "--threads", "1", "--workdir", str(tmp_path / "work"), "--data", str(data)]
    assert refusal(deploy.main, [*argv, "--trained", memattn, transformer], capsys).endswith(
        f"argument --trained: {memattn} holds a transformer_memattn model, not a transformer "
        "(give a fairseq transformer, then a transformer_memattn)")
    garbage = tmp_path / "garbage.pt"
    garbage.write_text("garbage")
    assert f"argument --trained: {garbage} is not a fairseq checkpoint" in refusal(
        deploy.main, [*argv, "--trained", transformer, str(garbage)], capsys)
    assert refusal(deploy.main, [*argv[:-2], "--data", str(tmp_path), "--trained", transformer, memattn],
                   capsys).endswith(f"argument --data: {tmp_path}: no bpe/test.en, data-bin/dict.en.txt in it")
    assert deploy.parse_args([*argv, "--trained", transformer, memattn]).trained == [transformer, memattn]
