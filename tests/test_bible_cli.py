"""The Bible recipes' command lines: a bad value ends in argparse's one line naming it, before
anything is trained, decoded, downloaded or deleted."""

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile

import pytest
from conftest import REPO, clean_env

from recipes.bible import compare, converge, converge_cpu, corpus, deploy_quality, lstm_gap

PREPARED = ("data-bin/dict.en.txt", "data-bin/dict.fr.txt", *(f"data-bin/{subset}.en-fr.{lang}.idx"
            for subset in ("valid", "test") for lang in ("en", "fr")),
            "ref/valid.fr", "ref/test.fr", "bpe/valid.en", "bpe/test.en", "spm.model")


def prepared_data(folder, without=()):
    """A stand-in for recipes.wmt17.run prepare's output (empty files), less the parts WITHOUT."""
    for part in PREPARED:
        if part not in without:
            os.makedirs(os.path.dirname(os.path.join(folder, part)), exist_ok=True)
            open(os.path.join(folder, part), "w").close()
    return str(folder)


def refused(main, argv, capsys):
    """The last line main(ARGV) wrote to stderr, where it exited with argparse's code 2."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err
    return err.strip().splitlines()[-1]


def contents(folder):
    return sorted(os.path.relpath(os.path.join(top, name), folder)
                  for top, folders, files in os.walk(folder) for name in folders + files)


# converge report and pack

def earlier_report(folder):
    """An earlier report's --out: what run staged and report wrote, and a note of one's own."""
    for name, text in {"machine.txt": "python 3.12.3\ngpu NVIDIA H200\n", "table.md": "old table\n",
                       "README.md": "how the table was made\n", "lstm_att/train.log": "old log\n",
                       "curves_lstm_att.png": "", "notes/plan.txt": "kept\n"}.items():
        os.makedirs(os.path.dirname(folder / name), exist_ok=True)
        (folder / name).write_text(text)
    return folder


def archive(path, machine=True):
    """A converge run archive: the machine, and a transformer's log with one validation."""
    stage = path.parent / "stage" / "converged"
    (stage / "transformer").mkdir(parents=True)
    if machine:
        (stage / "machine.txt").write_text("python 3.11\n")
    (stage / "transformer" / "train.log").write_text(
        "2026-01-01 00:00:00 | INFO | fairseq_cli.train | {'_name': None}\n"
        "2026-01-01 00:01:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 5.0 | nll_loss 1 "
        "| num_updates 100\n")
    with tarfile.open(path, "w:gz") as tar:
        tar.add(stage, arcname="converged")
    return str(path)


def test_report_checks_the_archive_and_data_before_it_deletes_anything(tmp_path, capsys):
    out = earlier_report(tmp_path / "out")
    before = contents(out)
    data = prepared_data(tmp_path / "data")
    not_gzip = tmp_path / "notes.tar.gz"
    not_gzip.write_text("x")
    cases = {
        str(tmp_path / "none.tar.gz"): f"argument archive: {tmp_path / 'none.tar.gz'}: no such file",
        str(not_gzip): f"argument archive: {not_gzip}: not a readable .tar.gz (not a gzip file)",
        archive(tmp_path / "a" / "bare.tar.gz", machine=False):
            f"argument archive: {tmp_path / 'a' / 'bare.tar.gz'}: no converged/machine.txt in it "
            "(not an archive of `converge run`)"}
    for path, message in cases.items():
        assert refused(converge.main, ["report", path, "--data", data, "--out", str(out)], capsys).endswith(message)
    no_sources = prepared_data(tmp_path / "no_bpe", without=("bpe/test.en",))
    assert refused(converge.main, ["report", archive(tmp_path / "b" / "a.tar.gz"), "--data", no_sources, "--out",
                                   str(out)], capsys).endswith(
        f"argument --data: {no_sources}: no bpe/test.en in it (recipes.wmt17.run prepare's output)")
    assert contents(out) == before


def test_report_refuses_a_folder_that_is_not_an_earlier_reports(tmp_path, capsys):
    out = tmp_path / "converged"  # the CPU run's results beside the GPU's folder
    (out / "cpu" / "transformer").mkdir(parents=True)
    (out / "table.md").write_text("the CPU run's table\n")
    before = contents(out)
    error = refused(converge.main, ["report", archive(tmp_path / "a.tar.gz"), "--data", prepared_data(tmp_path / "d"),
                                    "--out", str(out)], capsys)
    assert error.endswith(f"argument --out: {out}: not empty, and no machine.txt in it (not an earlier report's "
                          "folder): give a new or empty folder, or an earlier report's")
    assert contents(out) == before


def test_report_replaces_an_earlier_reports_files_and_keeps_the_rest(tmp_path):
    out = earlier_report(tmp_path / "out")
    assert converge.main(["report", archive(tmp_path / "a.tar.gz"), "--data", prepared_data(tmp_path / "d"),
                          "--out", str(out)]) is None
    assert sorted(os.listdir(out)) == ["README.md", "curves_transformer.png", "machine.txt", "notes", "table.md",
                                       "transformer"]
    assert (out / "README.md").read_text() == "how the table was made\n" and (out / "notes" / "plan.txt").exists()
    assert (out / "machine.txt").read_text() == "python 3.11\n"
    assert "| transformer | CPU |" in (out / "table.md").read_text()


def test_pack_checks_the_data_before_it_replaces_the_bundles(tmp_path, capsys):
    bundle = tmp_path / "bundle"
    (bundle / "data-bin").mkdir(parents=True)
    (bundle / "data-bin" / "dict.en.txt").write_text("kept\n")
    error = refused(converge.main, ["pack", "--data", str(tmp_path / "none"), "--bundle", str(bundle), "--no-wheels"],
                    capsys)
    assert error.endswith(f"argument --data: {tmp_path / 'none'}: no such folder (recipes.wmt17.run prepare's output)")
    data = prepared_data(tmp_path / "data", without=("spm.model",))
    assert refused(converge.main, ["pack", "--data", data, "--bundle", str(bundle), "--no-wheels"],
                   capsys).endswith(f"argument --data: {data}: no spm.model in it (recipes.wmt17.run prepare's output)")
    assert (bundle / "data-bin" / "dict.en.txt").read_text() == "kept\n"
    data = prepared_data(tmp_path / "data")
    assert refused(converge.main, ["pack", "--data", data, "--bundle", data + "/", "--no-wheels"], capsys).endswith(
        f"argument --bundle: {data}/: the --data folder itself (pack replaces its data-bin and ref)")
    assert os.path.isfile(os.path.join(data, "ref", "test.fr"))


# converge run, and the GPU machine's script around it

@pytest.mark.parametrize("options, message", [
    (["--smoke-updates", "0"], "argument --smoke-updates: invalid value 0 (must be an integer >= 1)"),
    (["--max-update", "-1"], "argument --max-update: invalid value -1 (must be an integer >= 0)"),
    (["--minutes", "0"], "argument --minutes: invalid value 0 (must be a finite number > 0)"),
    (["--minutes", "3"], "argument --minutes: 3 minus --decode-minutes 2.5 leaves 0.5 minutes for the smoke step "
                         "and training, at least 2 needed (raise --minutes or lower --decode-minutes)"),
    (["--models", "lstm_att", "transformer", "lstm_att"], "argument --models: lstm_att given more than once"),
])
def test_run_checks_its_options_before_anything_runs(tmp_path, capsys, options, message):
    bundle = prepared_data(tmp_path / "bundle")
    argv = ["run", "--bundle", bundle, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--cpu",
            *options, "--check"]
    assert refused(converge.main, argv, capsys).endswith(message)
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_run_checks_the_bundle_and_its_folders(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    bundle = prepared_data(tmp_path / "bundle", without=("ref/valid.fr",))
    run = ["run", "--cpu", "--check"]
    assert refused(converge.main, [*run, "--bundle", bundle, "--out", str(tmp_path / "o")], capsys).endswith(
        f"argument --bundle: {bundle}: no ref/valid.fr in it")
    bundle = prepared_data(tmp_path / "bundle")
    assert refused(converge.main, [*run, "--bundle", bundle, "--out", str(a_file / "o")], capsys).endswith(
        f"argument --out: {a_file / 'o'}: {a_file} is a file, not a folder")
    assert converge.main([*run, "--bundle", bundle, "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'o'}\n" and not (tmp_path / "o").exists()


def test_gpu_script_checks_the_options_before_it_installs(tmp_path):
    """converge_gpu.sh with a python3 that records the install and the run instead of doing them."""
    calls, fake = tmp_path / "calls", tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/sh
case "$*" in
  "-m pip "*) echo pip >> {calls}; exit 0;;
  *--check*) exec {sys.executable} "$@";;
  "-m recipes.bible.converge run "*) echo run >> {calls}; exit 0;;
esac
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    env = clean_env(PATH=f"{fake.parent}:{os.environ['PATH']}")
    bundle, out = prepared_data(tmp_path / "bundle"), tmp_path / "out"

    def script(*args):
        return subprocess.run(["bash", os.path.join(REPO, "recipes", "bible", "converge_gpu.sh"), *args], env=env,
                              capture_output=True, text=True, timeout=120)

    ran = script("--bundle", bundle)
    assert ran.returncode == 2 and "error: the following arguments are required: --out" in ran.stderr
    ran = script(f"--out={out}", "--bundle", bundle, "--smoke-updates", "0")
    assert ran.returncode == 2 and "argument --smoke-updates: invalid value 0" in ran.stderr
    assert not calls.exists() and not out.exists()  # nothing installed, nothing made
    ran = script(f"--out={out}", "--bundle", bundle)
    assert ran.returncode == 0, ran.stderr
    assert calls.read_text().split() == ["pip", "run"] and (out / "run.log").exists()


# converge_cpu

@pytest.mark.parametrize("missing", ["data-bin", "ref/valid.fr", "ref/test.fr", "bpe/valid.en", "bpe/test.en"])
def test_cpu_driver_checks_all_it_reads_of_the_data_before_training(tmp_path, capsys, missing):
    data = prepared_data(tmp_path / "data", without=[part for part in PREPARED if part.startswith(missing)])
    shutil.rmtree(os.path.join(data, missing), ignore_errors=True)  # data-bin, the folder
    error = refused(converge_cpu.main, ["--data", data, "--work", str(tmp_path / "work"), "--out",
                                        str(tmp_path / "out")], capsys)
    assert error.endswith(f"argument --data: {data}: no {missing} in it (recipes.wmt17.run prepare's output)")
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


# a file where a folder is expected

def test_a_file_where_a_folder_goes_is_refused(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    data = prepared_data(tmp_path / "data")
    message = f"{a_file}: {a_file} is a file, not a folder"
    assert refused(converge_cpu.main, ["--data", data, "--work", str(a_file)],
                   capsys).endswith(f"argument --work: {message}")
    assert refused(converge_cpu.main, ["--data", data, "--out", str(a_file), "--report"],
                   capsys).endswith(f"argument --out: {message}")
    assert refused(compare.main, ["report", "--data", data, "--out", str(a_file)],
                   capsys).endswith(f"argument --out: {message}")
    assert refused(corpus.main, [str(a_file)], capsys).endswith(f"argument out: {message}")
    assert a_file.read_text() == "x"


# compare

def test_compare_train_checks_the_data_and_the_budget_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(compare, "run_logged", lambda *args: pytest.fail("fairseq-train started"))
    train = ["train", "transformer", "--out", str(tmp_path / "out"), "--checkpoints", str(tmp_path / "c")]
    assert refused(compare.main, [*train, "--data", str(tmp_path / "none")], capsys).endswith(
        f"argument --data: {tmp_path / 'none'}: no such folder (recipes.wmt17.run prepare's output)")
    data = prepared_data(tmp_path / "data")
    for budget in ("0", "-5"):
        assert refused(compare.main, [*train, "--data", data, "--max-update", budget], capsys).endswith(
            f"argument --max-update: invalid value {budget} (must be an integer >= 1)")
    assert not (tmp_path / "out").exists()


def test_compare_train_says_where_a_failure_is_logged(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(compare, "run_logged", lambda command, log: 1)
    with pytest.raises(SystemExit) as stopped:
        compare.main(["train", "transformer", "--data", prepared_data(tmp_path / "data"), "--out",
                      str(tmp_path / "out"), "--checkpoints", str(tmp_path / "c")])
    log = tmp_path / "out" / "transformer" / "train.log"
    assert stopped.value.code == 1 and capsys.readouterr().err == f"fairseq-train failed (exit 1): see {log}\n"


# deploy_quality

def fake_checkpoint(path, arch):
    """What fairseq's loader needs of a checkpoint to tell its model, without the weights."""
    import torch

    torch.save({"model": {}, "extra_state": {}, "optimizer_history": [
        {"criterion_name": "x", "optimizer_name": "x", "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "cfg": {"model": argparse.Namespace(arch=arch, _name=arch), "task": argparse.Namespace(_name="translation")}},
        path)
    return str(path)


def test_deploy_quality_checks_its_inputs_before_decoding(tmp_path, capsys, monkeypatch):
    from recipes.wmt17 import run as wmt17_run

    monkeypatch.setattr(wmt17_run, "evaluate", lambda *args, **kwargs: pytest.fail("fairseq-generate started"))
    data, a_file = prepared_data(tmp_path / "data"), tmp_path / "a_file"
    a_file.write_text("x")
    transformer = fake_checkpoint(tmp_path / "transformer.pt", "transformer_iwslt_de_en")
    work = ["--workdir", str(tmp_path / "work")]
    cases = [
        ([str(tmp_path / "none.pt"), "--data", data], f"argument checkpoint: {tmp_path / 'none.pt'}: no such file"),
        ([transformer, "--data", str(tmp_path / "none")],
         f"argument --data: {tmp_path / 'none'}: no such folder (recipes.wmt17.run prepare's output)"),
        ([transformer, "--data", data, "--pair", "en-de"],
         f"argument --data: {data}: no data-bin/dict.de.txt, data-bin/test.en-de.en.idx, data-bin/test.en-de.de.idx, "
         "ref/test.de in it (recipes.wmt17.run prepare's output)"),
        ([transformer, "--data", data, "--pair", "en"], "argument --pair: invalid language pair 'en'"),
        ([transformer, "--data", data, "--subset", "train"],
         "argument --subset: invalid choice: 'train' (choose from 'valid', 'test')"),
        ([transformer, "--data", data, "--out", str(a_file / "r.md")],
         f"argument --out: {a_file / 'r.md'}: {a_file} is a file, not a folder"),
        ([transformer, "--data", data, "--beam", "0"], "argument --beam: invalid value 0 (must be an integer >= 1)"),
        ([transformer, "--data", data], f"argument checkpoint: unsupported model 'transformer_iwslt_de_en' in "
                                        f"{transformer}: the export supports transformer_memattn"),
        ([str(a_file), "--data", data], f"argument checkpoint: {a_file} is not a fairseq checkpoint"),
    ]
    for argv, message in cases:
        assert message in refused(deploy_quality.main, [*argv, *work], capsys)
    assert not (tmp_path / "work").exists()


# lstm_gap

def test_lstm_gap_checks_the_data_and_outputs(tmp_path, capsys):
    data = prepared_data(tmp_path / "data")
    hyp = tmp_path / "hyp.fr"
    hyp.write_text("")
    assert refused(lstm_gap.main, ["--data", str(tmp_path / "none"), "--hyp", f"a={hyp}"], capsys).endswith(
        f"argument --data: {tmp_path / 'none'}: no such folder (recipes.wmt17.run prepare's output)")
    assert refused(lstm_gap.main, ["--data", data, "--hyp", f"a={tmp_path / 'none'}"], capsys).endswith(
        f"argument --hyp: {tmp_path / 'none'}: no such file")
    assert refused(lstm_gap.main, ["--data", data, "--hyp", f"a={hyp}", "--hyp", f"b={hyp}", "--hyp", f"a={hyp}"],
                   capsys).endswith("argument --hyp: a given more than once (each LABEL names one output)")


# corpus

def fake_bible(folder):
    """A bible.db of two translations, 4 and l, three books of two verses, and one verse of 4 alone."""
    folder.mkdir(exist_ok=True)
    con = sqlite3.connect(folder / "bible.db")
    con.execute("create table bible (bbName, bNumber, cNumber, vNumber, vText)")
    con.executemany("insert into bible values (?, ?, ?, ?, ?)",
                    [(code, book, 1, verse, f"{code} {book} {verse}") for code in ("4", "l") for book in (1, 42, 45)
                     for verse in (1, 2)] + [("4", 1, 1, 3, "alone")])
    con.commit()
    con.close()
    return str(folder / "bible.db")


def test_corpus_refuses_what_would_write_a_wrong_corpus(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(corpus, "bible_db", lambda tmp: pytest.fail("downloaded"))
    assert refused(corpus.main, [str(out), "--tgt-lang", "en"], capsys).endswith(
        "argument --src-lang/--tgt-lang: invalid language pair 'en-en' (expected two different language codes joined "
        "by '-', like en-fr; a code is letters, digits and '_', starting with a letter)")
    assert refused(corpus.main, [str(out), "--test-book", "42"], capsys).endswith(
        "argument --test-book: 42 is the --valid-book too (each split needs a book of its own)")
    assert refused(corpus.main, [str(out), "--tgt", "v"], capsys).endswith(
        "argument --tgt: v is not --pair en-fr's translation: give --tgt-lang too, the language code of its files")
    db = fake_bible(tmp_path / "db")
    monkeypatch.setattr(corpus, "bible_db", lambda tmp: db)
    assert refused(corpus.main, [str(out), "--src", "zz", "--src-lang", "xx"], capsys).endswith(
        "argument --src: unknown translation code 'zz' (choose from 4, l)")
    assert refused(corpus.main, [str(out), "--test-book", "66"], capsys).endswith(
        "argument --test-book: no verse of book 66 in both 4 and l")
    assert not out.exists()
    corpus.main([str(out)])
    assert capsys.readouterr().out == f"en-fr (4 -> l) in {out}: train 2, valid 2, test 2\n"
    assert (out / "test.en").read_text() == "4 45 1\n4 45 2\n" and (out / "test.fr").read_text() == "l 45 1\nl 45 2\n"
