"""recipes/speed/deploy.py: its bookkeeping, and one tiny cell end to end on the export (the timings
themselves need CTranslate2 and run by hand)."""

import json
import subprocess
import sys

import pytest
from conftest import REPO, clean_env

from recipes.speed.deploy import median_over_rounds


def test_each_cell_reports_the_median_of_its_rounds():
    def row(engine, seconds, round_, peak=100.0, source_len=10):
        return {"engine": engine, "threads": 1, "S": source_len, "T": source_len, "seconds": seconds,
                "peak_mib": peak, "output_tokens": 640, "round": round_}

    rows = [row("ct2-int8", 0.30, 0), row("onnx-int8", 0.25, 0), row("ct2-int8", 0.18, 1, peak=120.0),
            row("onnx-int8", 0.40, 1), row("ct2-int8", 0.20, 2), row("onnx-int8", 0.27, 2),
            row("onnx-int8", 0.50, 0, source_len=20)]
    merged = {(r["engine"], r["S"]): r for r in median_over_rounds(rows)}
    assert len(merged) == 3
    assert merged[("ct2-int8", 10)]["seconds"] == 0.20 and merged[("ct2-int8", 10)]["peak_mib"] == 120.0
    assert merged[("onnx-int8", 10)]["seconds"] == 0.27 and merged[("onnx-int8", 10)]["rounds"] == 3
    assert merged[("onnx-int8", 20)]["seconds"] == 0.50 and merged[("onnx-int8", 20)]["rounds"] == 1


def test_the_report_compares_each_cell_best_against_best():
    from recipes.speed.deploy import engine_factors, parse_args, targets

    # CTranslate2's rows are read, not timed: the arguments need not name its engines (nor it installed)
    args = parse_args(["--source-lens", "--copy-lens", "10", "--threads", "1", "--engines", "onnx-f32", "onnx-int8"])
    seconds = {"ct2-f32": 0.50, "ct2-int8": 0.40, "onnx-f32": 0.60, "onnx-int8": 0.36}
    rows = [{"engine": e, "threads": 1, "S": 10, "T": 10, "seconds": s} for e, s in seconds.items()]
    lines = targets(rows, args).splitlines()
    assert "- 1 thread(s), int8, |S| = 10, |T| = 10: exported memattn 0.36 s vs CTranslate2 0.40 s (1.11x)" in lines
    assert lines[-1] == "- 1 thread(s), |S| = 10, |T| = 10: the export's best over CTranslate2's best **0.90**"
    assert engine_factors(rows, args) == ""  # no fairseq-generate rows to compare with


@pytest.mark.slow
def test_one_tiny_cell_end_to_end(tmp_path):
    """Models built, exported and timed in a worker process, the report written: the recipe imports
    this package before fairseq, so it registers the plugin itself."""
    pytest.importorskip("onnxruntime")
    rows = tmp_path / "rows.jsonl"
    command = [sys.executable, "-m", "recipes.speed.deploy", "--vocab", "20", "--memory-k", "4", "--source-lens",
               "--copy-lens", "5", "--sources", "2", "--beam", "2", "--threads", "1", "--engines", "onnx-f32",
               "--repeats", "1", "--workdir", str(tmp_path / "work"), "--rows", str(rows), "--out", str(tmp_path / "x.md")]
    result = subprocess.run(command, env=clean_env(OMP_NUM_THREADS="1"), cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    [row] = [json.loads(line) for line in rows.read_text().splitlines()]
    assert (row["engine"], row["S"], row["T"], row["output_tokens"]) == ("onnx-f32", 5, 5, 2 * 5)
    assert "| 5 | 5 |" in (tmp_path / "x.md").read_text()
