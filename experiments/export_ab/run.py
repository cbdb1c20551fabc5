"""Two exports of the same model timed against each other, interleaved in one process, so that the
machine's drift between runs falls on both alike: random sources of each length, every output
forced to that length, the median of --repeats translations of the whole batch by each.

    python -m experiments.export_ab.run BEFORE AFTER --threads 1 --lengths 10 20 30 50 --sources 64 --beam 4

With --before-code CHECKOUT (a checkout of the repository at an earlier commit, e.g. made by
``git worktree add CHECKOUT COMMIT``), BEFORE is translated by that checkout's translator: a change
to the translator timed on one export (BEFORE and AFTER may be the same folder).

With --test-split DATA the batches are DATA's test split instead (recipes.wmt17.run prepare's layout,
bpe/test.SRC), --sources sentences each in file order, with fairseq's default output lengths: what
recipes/speed/deploy.py times with --trained.

With --after-options NAME=VALUE ..., AFTER's ONNX Runtime session gets those settings on top of the
translator's: SessionOptions attributes (enable_mem_pattern=0) or session config entries
(session.intra_op.allow_spinning=0); BEFORE and AFTER may then be the same folder.

Prints a markdown table: seconds of each export and AFTER's time over BEFORE's, and the median
milliseconds of a batch's first decoder step and of its later ones.
"""

import argparse
import importlib
import importlib.util
import os
import sys
import time

import numpy as np

from fairseq_memattn.deploy.translator import Translator, default_session_options
from recipes.speed.deploy import padded_left, source_symbols, test_split_batches
from recipes.speed.profile_export import forced_batch


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", help="a folder written by fairseq-memattn-export")
    p.add_argument("after", help="another export of the same model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lengths", type=int, nargs="+", default=[10, 20, 30, 50])
    p.add_argument("--sources", type=int, default=64)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--before-code", metavar="CHECKOUT", help="translate BEFORE with this checkout's translator")
    p.add_argument("--test-split", metavar="DATA", help="time DATA's test split in place of random sources")
    p.add_argument("--source-lang", default="en", help="with --test-split: the source side")
    p.add_argument("--after-options", nargs="+", default=[], metavar="NAME=VALUE",
                   help="ONNX Runtime session settings for AFTER: SessionOptions attributes or config entries")
    args = p.parse_args(argv)
    before_translator = translator_of(args.before_code) if args.before_code else Translator
    kinds = (before_translator, Translator)
    step_times = []
    for kind in kinds:
        time_steps(kind, step_times)
    translators = [kind(folder, session_options=options)
                   for kind, folder, options in zip(kinds, (args.before, args.after),
                                                    (default_session_options(args.threads),
                                                     session_options(args.threads, args.after_options)))]
    rng = np.random.default_rng(0)
    print(f"{args.sources} sources, beam {args.beam}, {args.threads} thread(s), median of {args.repeats}\n")
    print("| \\|S\\| = \\|T\\| | before | after | after / before | first step, ms (before, after) "
          "| a later step, ms (before, after) |\n|---:|---:|---:|---:|---:|---:|")
    for length, batches, options in cells(translators[0], rng, args):
        seconds = [[], []]
        for translator in translators:
            translator.generate(batches[0][:2], **options)  # warm-up
        step_times.clear()
        for _ in range(args.repeats):
            for times, translator in zip(seconds, translators):
                start = time.perf_counter()
                for batch in batches:
                    translator.generate(batch, **options)
                times.append(time.perf_counter() - start)
        before, after = (float(np.median(t)) for t in seconds)
        first, later = ([np.median([t for session, step, t in step_times
                                    if session is translator.decoder and (step > 0) == part]) * 1000
                         for translator in translators] for part in (False, True))
        print(f"| {length} | {before:.3f} | {after:.3f} | {after / before:.2f} | {first[0]:.1f}, {first[1]:.1f} "
              f"| {later[0]:.1f}, {later[1]:.1f} |", flush=True)


def session_options(threads: int, settings: list):
    """The translator's SessionOptions with each NAME=VALUE set: an attribute of SessionOptions
    (a number, a boolean as 0/1, an enum by its number), else a session config entry."""
    options = default_session_options(threads)
    for setting in settings:
        name, _, value = setting.partition("=")
        if not value:
            raise SystemExit(f"--after-options: expected NAME=VALUE, got {setting!r}")
        if hasattr(options, name):
            current = getattr(options, name)
            setattr(options, name, type(current)(int(value)))
        else:
            options.add_session_config_entry(name, value)
    return options


def cells(translator, rng, args):
    """(row label, batches, generate's options) of each row of the table."""
    if args.test_split:
        data = argparse.Namespace(trained=True, data=args.test_split, source_lang=args.source_lang,
                                  sources=args.sources)
        batches = test_split_batches(data, source_symbols(data))
        yield "test split", [padded_left(batch)[0] for batch in batches], dict(beam=args.beam)
        return
    for length in args.lengths:
        src, options = forced_batch(translator, rng, args.sources, length, length, args.beam)
        yield length, [src], options


def time_steps(translator_class, times: list) -> None:
    """Appends (decoder session, step, seconds) to ``times`` for every decoder step that the class's
    translators run from now on."""
    decoder_run = sys.modules[translator_class.__module__].DecoderRun
    if getattr(decoder_run.step, "timed", False):
        return
    step = decoder_run.step

    def timed(self, tokens, position, *args):
        start = time.perf_counter()
        result = step(self, tokens, position, *args)
        times.append((self.session, position, time.perf_counter() - start))
        return result

    timed.timed = True
    decoder_run.step = timed


def translator_of(checkout: str):
    """The Translator class of another checkout's package, imported under another name."""
    package = os.path.join(os.path.abspath(checkout), "fairseq_memattn")
    if not os.path.isfile(os.path.join(package, "deploy", "translator.py")):
        raise SystemExit(f"--before-code: {checkout} has no fairseq_memattn/deploy/translator.py")
    name = "fairseq_memattn_before"
    spec = importlib.util.spec_from_file_location(name, os.path.join(package, "__init__.py"),
                                                  submodule_search_locations=[package])
    sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[name])
    return importlib.import_module(f"{name}.deploy.translator").Translator


if __name__ == "__main__":
    main()
