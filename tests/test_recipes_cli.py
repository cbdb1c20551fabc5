"""recipes/cli.py's path checks and fairseq_memattn.arg_types's numbers: argparse's one line
naming the bad value, before any work."""

import argparse
import os

import pytest

from fairseq_memattn import arg_types
from recipes import cli


def refusal(kind, text):
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        kind(text)
    return str(refused.value)


def test_paths_that_cannot_be_what_the_option_needs_are_named(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert refusal(cli.existing_file, str(tmp_path / "none")) == f"{tmp_path / 'none'}: no such file"
    assert refusal(cli.existing_file, str(tmp_path)) == f"{tmp_path}: a folder, not a file"
    assert refusal(cli.existing_dir, str(a_file)) == f"{a_file}: a file, not a folder"
    assert refusal(cli.folder_with("data-bin", "ref"), str(tmp_path)) == f"{tmp_path}: no data-bin, ref in it"
    assert refusal(cli.output_dir, str(a_file / "out")) == f"{a_file / 'out'}: {a_file} is a file, not a folder"
    assert refusal(cli.output_file, str(a_file / "out" / "t.md")) == f"{a_file / 'out' / 't.md'}: {a_file} is a file, not a folder"
    assert refusal(cli.output_file, str(tmp_path)) == f"{tmp_path}: a folder (give the file's name)"
    assert refusal(cli.output_dir, "") == "an empty path (give a folder)"  # not the current folder, not a default
    too_long = tmp_path / "new" / ("x" * 300)
    assert refusal(cli.output_dir, str(too_long / "out")) == f"{too_long / 'out'}: cannot make {too_long} (File name too long)"
    assert not (tmp_path / "new").exists()  # the folders made for the try are gone again
    # "link/.." is the parent of where the link leads, for the checks as for the system
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "blocker").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "d" / "sub")
    through_link = str(tmp_path / "link" / ".." / "blocker" / "out")
    assert refusal(cli.output_dir, through_link) == f"{through_link}: {tmp_path / 'd' / 'blocker'} is a file, not a folder"
    # a link to nothing on the way: the system makes no folder through it
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "deeper")
    for kind, text in ((cli.output_dir, tmp_path / "dangling"), (cli.output_dir, tmp_path / "dangling" / "out"),
                       (cli.output_file, tmp_path / "dangling" / "out" / "t.md")):
        assert refusal(kind, str(text)) == (f"{text}: {tmp_path / 'dangling'} is a link to "
                                            f"{tmp_path / 'nowhere' / 'deeper'}, which does not exist")
    assert not (tmp_path / "nowhere").exists()
    if os.path.isdir("/proc/1"):  # a folder no one, root included, can make folders in
        assert refusal(cli.output_dir, "/proc/1/out") == "/proc/1/out: cannot make /proc/1/out (No such file or directory)"


def test_an_output_folder_made_meanwhile_by_a_process_beside_it_passes_and_stays(tmp_path, monkeypatch):
    """A driver starts its runs at once, each checking the same new --out: the one that loses the
    race to make it is not refused, and does not remove the winner's folder."""
    real_mkdir = os.mkdir

    def beaten(path, *args):
        real_mkdir(path, *args)  # the other process, first
        raise FileExistsError(17, "File exists", path)

    monkeypatch.setattr(os, "mkdir", beaten)
    assert cli.output_dir(str(tmp_path / "out")) == str(tmp_path / "out")
    assert (tmp_path / "out").is_dir()


def test_paths_that_fit_pass_and_an_output_file_gets_its_folder_before_the_work(tmp_path):
    (tmp_path / "data-bin").mkdir()
    assert cli.folder_with("data-bin")(str(tmp_path)) == str(tmp_path)
    assert cli.output_dir(str(tmp_path / "new" / "deeper")) == str(tmp_path / "new" / "deeper")
    assert not (tmp_path / "new").exists()  # a folder is made by whoever writes into it
    target = tmp_path / "results" / "table.md"
    assert cli.output_file(str(target)) == str(target) and target.parent.is_dir() and not target.exists()


@pytest.mark.parametrize("kind, text, message", [
    (arg_types.positive_int, "0", "invalid value 0 (must be an integer >= 1)"),
    (arg_types.non_negative_int, "-1", "invalid value -1 (must be an integer >= 0)"),
    (arg_types.positive_int, "2.5", "invalid value '2.5' (must be an integer >= 1)"),
    (arg_types.positive_number, "0", "invalid value 0 (must be a finite number > 0)"),
    (arg_types.positive_number, "nan", "invalid value nan (must be a finite number > 0)"),
    (arg_types.positive_number, "x", "invalid value 'x' (must be a number > 0)"),
    (arg_types.probability_below_one, "1", "invalid value 1 (must be a number in [0, 1))"),
])
def test_numbers_out_of_range_are_refused_with_what_is_allowed(kind, text, message):
    assert refusal(kind, text) == message


def test_changed_names_each_setting_that_differs_as_an_option_with_its_value_now():
    """The one form of every recipe's refusal to reuse results made with other settings."""
    recorded = {"beam": 30, "memory_k": 4, "trained": ["a.pt", "b.pt"], "only_recorded": 1}
    assert cli.changed(recorded, {"beam": 4, "memory_k": 4, "trained": ["a.pt"], "only_now": 2}) == (
        "--beam 30 (now 4), --trained a.pt b.pt (now a.pt)")
    assert cli.changed(recorded, {"beam": 4, "memory_k": 8}, most=1) == "--beam 30 (now 4), 1 more"
    # a setting only one side has is not compared; nothing changed reads ""
    assert cli.changed({"beam": 30}, {"beam": 30, "threads": 1}) == ""
    assert cli.changed({"beam": 30, "threads": 1}, {"beam": 30}) == ""
    assert cli.changed({}, {}) == ""
