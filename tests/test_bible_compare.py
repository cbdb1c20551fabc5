"""recipes/bible/compare.py's report on written logs and scores: a table per baseline with its memory
models' BLEU against its own, and no evaluation of a run that is still training."""

import json

from test_bible_cli import prepared_data

from recipes.bible import compare


def train_log(losses, finished=True):
    lines = ["$ fairseq-train ...\n",
             "2026-01-01 00:00:00 | INFO | fairseq_cli.train | {'_name': None}\n"]
    for i, loss in enumerate(losses, 1):
        lines.append(f"2026-01-01 00:{i:02d}:00 | INFO | valid | epoch {i:03d} | valid on 'valid' subset | "
                     f"loss {loss} | nll_loss 1 | ppl 2 | wps 1 | wpb 1 | bsz 1 | num_updates {100 * i}\n")
    if finished:
        lines += ["x | INFO | fairseq_cli.train | Stopping training due to num_updates: 300 >= max_update: 300\n",
                  "x | INFO | fairseq_cli.train | done training in 9.0 seconds\n"]
    return "".join(lines)


def test_report_tables_per_baseline(tmp_path):
    out, checkpoints = tmp_path / "results", tmp_path / "checkpoints"
    runs = {"transformer": ([7.0, 6.0, 5.5], {"bleu": 10.0, "decoding_seconds": 3.1}),
            "transformer_memattn": ([7.2, 6.1, 5.6], {"bleu": 9.5, "decoding_seconds": 2.0}),
            "lstm_att": ([6.5, 6.0], None)}  # still training
    for model, (losses, score) in runs.items():
        (out / model).mkdir(parents=True)
        (out / model / "train.log").write_text(train_log(losses, finished=score is not None))
        if score:
            (out / model / "score.json").write_text(json.dumps(score))
    # A checkpoint of the unfinished run: evaluating it would fail (it is no checkpoint) and stop the report.
    (checkpoints / "lstm_att").mkdir(parents=True)
    (checkpoints / "lstm_att" / "checkpoint_best.pt").write_text("not a checkpoint")

    compare.main(["report", "--data", prepared_data(tmp_path / "data"), "--out", str(out),
                  "--checkpoints", str(checkpoints)])
    table = (out / "table.md").read_text()
    transformers = table[table.index("## Against transformer"):table.index("## Against lstm_att")]
    assert "| transformer | 300 | 180 | 5.500 (300) | 10.0 |  | 3.1 |" in transformers
    assert "| transformer_memattn | 300 | 180 | 5.600 (300) | 9.5 | -0.50 | 2.0 |" in transformers
    lstm = table[table.index("## Against lstm_att"):]
    assert "| lstm_att | 200 | 120 | 6.000 (200) |  |  |  |" in lstm and "| lstm_memattn |" not in lstm
    assert not (out / "lstm_att" / "score.json").exists()
    for baseline in compare.COMPARISONS:
        assert (out / f"curves_{baseline}.png").stat().st_size > 0


def test_report_leaves_out_a_run_that_never_trained(tmp_path, capsys):
    out = tmp_path / "results"
    (out / "transformer").mkdir(parents=True)
    (out / "transformer" / "train.log").write_text("$ fairseq-train ...\nTraceback (most recent call last):\n"
                                                  "FileNotFoundError: data-bin/dict.en.txt\n")
    (out / "transformer_memattn").mkdir()
    (out / "transformer_memattn" / "train.log").write_text(train_log([7.0, 6.0]))
    (out / "transformer_memattn" / "score.json").write_text(json.dumps({"bleu": 9.5, "decoding_seconds": 2.0}))
    compare.main(["report", "--data", prepared_data(tmp_path / "data"), "--out", str(out),
                  "--checkpoints", str(tmp_path / "checkpoints")])
    table = (out / "table.md").read_text()
    assert "| transformer_memattn | 200 |" in table and "| transformer |" not in table
    assert (f"transformer: no validation in {out / 'transformer'}/train.log (its training failed at the start, "
            "or is in its first epoch): left out") in capsys.readouterr().err
