"""recipes/speed/benchmark.py on a tiny grid: it runs, its tables hold what they claim, and
bad options are refused by name. (The speed itself is measured by the benchmark, not here.)"""

import csv
import subprocess
import sys

import pytest
from conftest import clean_env

BENCHMARK = ["-m", "recipes.speed.benchmark"]
REPORT = ["-m", "recipes.speed.report"]


def run_benchmark(*args, command=BENCHMARK):
    return subprocess.run([sys.executable, *command, *args], env=clean_env(), capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_tiny_grid(tmp_path):
    out = tmp_path / "speed"
    result = run_benchmark("--out", str(out), "--models", "noatt", "k4", "att", "lstm_att",
                           "--lengths", "4", "12", "--sources", "3", "--batch-size", "2",
                           "--beam", "2", "--repeats", "2", "--train-lengths", "6",
                           "--train-batch-size", "2", "--train-steps", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "decode.csv") as f:
        decode = {(r["model"], int(r["L"])): r for r in csv.DictReader(f)}
    assert len(decode) == 8 and all(r["repeats"] == "2" for r in decode.values())
    kib = {key: int(r["bytes_per_hypothesis"]) for key, r in decode.items()}
    # The fixed-size memory does not grow with L; attention over the states does.
    assert kib["k4", 4] == kib["k4", 12] < kib["att", 12]
    assert kib["att", 4] < kib["att", 12] and kib["lstm_att", 4] < kib["lstm_att", 12]
    with open(out / "train.csv") as f:
        feeding = [(r["model"], r["input_feeding"]) for r in csv.DictReader(f)]
    assert ("k4", "False") in feeding and ("k4", "True") in feeding and ("lstm_att", "True") in feeding
    report = (out / "speed.md").read_text()
    assert "K=32 / No Att" in report and "| K=4 |" in report
    assert (out / "decode_time.png").stat().st_size > 0
    # The report alone redraws them from the CSVs, and a folder without them is refused.
    (out / "speed.md").unlink()
    redrawn = run_benchmark(str(out), command=REPORT)
    assert redrawn.returncode == 0, redrawn.stderr[-2000:]
    made_by = "Made by `python -m recipes.speed.report " + str(out) + "`."
    assert (out / "speed.md").read_text().splitlines()[1:] == report.splitlines()[1:]
    assert made_by in (out / "speed.md").read_text()
    empty = run_benchmark(str(tmp_path), command=REPORT)
    assert empty.returncode == 2
    assert empty.stderr.splitlines()[-1] == f"report.py: error: no decode.csv in {tmp_path} (run recipes.speed.benchmark first)"

    # A second run finds every cell done and measures nothing again.
    again = run_benchmark("--out", str(out), "--models", "noatt", "--lengths", "4",
                          "--sources", "3", "--batch-size", "2", "--beam", "2", "--train-lengths")
    assert again.returncode == 0 and "decode L=" not in again.stdout


def test_transformer_decode_tiny(monkeypatch, capsys):
    """recipes/speed/transformer_decode.py on tiny models and lengths: every row of its tables is
    there, with positive numbers; the fixed-size memory's cache does not grow with |S|."""
    from recipes.speed import transformer_decode as td

    monkeypatch.setattr(td, "SIZES", [
        "--encoder-embed-dim", "16",
        "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"])
    long_rows, copy_rows, train, found = td.main([
        "--source-lens", "8", "80", "--target-len", "4", "--copy-lens", "8", "--sources", "2", "--beam", "2",
        "--repeats", "1", "--train-len", "8", "--train-steps", "1", "--layers", "2", "1"])
    assert [(r["S"], r["T"], r["model"]) for r in long_rows + copy_rows] == [
        (S, T, name) for S, T in ((8, 4), (80, 4), (8, 8)) for name in td.MODELS]
    for row in long_rows + copy_rows:
        assert row["runs"] == 1 and min(row["total"], row["encoder"], row["kib_self"]) > 0
        assert row["kib"] > row["kib_self"]
    kib = {(r["model"], r["S"]): r["kib"] for r in long_rows}
    assert kib["memattn K=64 attention", 8] == kib["memattn K=64 attention", 80]
    assert kib["transformer", 8] < kib["transformer", 80]
    assert set(train) == set(td.MODELS) and min(train.values()) > 0
    out = capsys.readouterr().out
    assert out.count("| 80 | 4 |") == len(td.MODELS) and "## Targets" in out and "2 + 1 layers" in out
    for arch_args in td.MODELS.values():  # --layers reaches every model: a deep encoder, a shallow decoder
        model, _, _ = td.build(arch_args, 8, (2, 1))
        assert (len(model.encoder.layers), len(model.decoder.layers)) == (2, 1)
    # Targets whose cells were not run say so; the rest are measured.
    assert {text for target, _, text, _, _ in found if "800" in target or "2000" in target} == {"not measured"}
    assert all(met for target, _, _, met, _ in found if "constant" in target)
