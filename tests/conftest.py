import argparse
import os
import pickle
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.sequence_generator import SequenceGenerator
from filelock import FileLock

# Under pytest-xdist each worker is one process of several on the machine: one thread each, for
# the worker and every command line it starts, since OpenMP threads that wait on a busy core make
# small operations many times slower.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO, "fairseq_memattn")
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, REPO)

from fairseq_memattn.models.lstm_memattn import MemAttnLSTMModel  # noqa: E402
from recipes.train_log import finished  # noqa: E402

# A left-padded batch of three sources and decoder inputs for it (BOS = EOS first).
SOURCES = [[3, 4, 5, 6, 7], [8, 9], [5]]
PREV_OUTPUT = torch.tensor([[2, 4, 5, 6], [2, 8, 9, 1], [2, 5, 1, 1]])
# Every --attention-type, and memory attention read by attention over its rows (--memory-read attention
# and general), by these names.
MEMORY_CONTENT_READS = {"memory/attention-read": "attention", "memory/general-read": "general"}
ALL_ATTENTION = ["none", "additive", "general", "dot", "scaled_dot", "memory", *MEMORY_CONTENT_READS, "linear",
                 "gated_linear"]


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: trains a model or starts a command line; in the full "
                            "suite only, not in the fast tier (docs/testing.md)")


def pytest_collection_modifyitems(config, items):
    """Modules with slow tests first, each module's tests in their order: under pytest-xdist
    (--dist loadscope, a module per worker at a time) the long ones start early and the quick
    ones fill in at the end."""
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module.__name__ not in slow)  # a stable sort


def clean_env(**extra):
    """The environment for fairseq's command lines: our plugin importable, and
    none of torch's switches that would turn weights_only loading off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}
    env["PYTHONPATH"] = REPO
    env.update(extra)
    return env


def run_fairseq(tool, *args, cwd=None, stdin=None, check=True):
    """Run a fairseq command line (fairseq-train, ...) to completion."""
    result = subprocess.run([os.path.join(BIN, tool), *args], cwd=cwd, env=clean_env(),
                            input=stdin, capture_output=True, text=True, timeout=1800)
    if tool == "fairseq-train" and finished(result.returncode, result.stdout + result.stderr):
        result.returncode = 0  # the teardown abort of recipes.train_log
    if check:
        assert result.returncode == 0, f"{tool} failed:\n{result.stderr[-3000:]}"
    return result


def make_dictionary(n_symbols=12):
    d = Dictionary()
    for i in range(n_symbols):
        d.add_symbol(str(i))
    return d


def make_args(**overrides):
    """Tiny sizes; encoder 2x8 so that dot attention fits the 16-unit decoder."""
    args = argparse.Namespace(
        encoder_embed_dim=8, encoder_hidden_size=8, encoder_layers=2,
        decoder_embed_dim=8, decoder_hidden_size=16, decoder_layers=2,
        dropout=0.0, memory_k=3,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def attention_args(**overrides):
    """What build_attention reads from the command line; memory attention, K = 4."""
    args = argparse.Namespace(attention_type="memory", attention_dim=None, memory_k=4,
                              memory_encoder_score="softmax", memory_decoder_score="softmax",
                              memory_encoder_normalize="contexts", memory_position_encoding=False,
                              memory_position_max_len=None, memory_position_window=False,
                              memory_read="mix", max_source_positions=10)
    vars(args).update(overrides)
    return args


def build_model(dictionary=None, seed=0, **overrides):
    dictionary = dictionary or make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    if overrides.get("attention_type") in MEMORY_CONTENT_READS:
        overrides.update(attention_type="memory", memory_read=MEMORY_CONTENT_READS[overrides["attention_type"]])
    torch.manual_seed(seed)
    model = MemAttnLSTMModel.build_model(make_args(**overrides), task)
    model.eval()
    return model


# Every attention type, with and without input feeding: a test taking
# (dictionary, attention_type, input_feeding) runs for each. With input feeding the
# model also has the attention mix: google/seq2seq's decoder, which the paper used.
for_every_model = pytest.mark.parametrize(
    "attention_type, input_feeding", [(kind, feeding) for feeding in (False, True) for kind in ALL_ATTENTION])


def build_every_model(dictionary, attention_type, input_feeding):
    """The model for_every_model stands for; memory attention with position encodings (Eq. 8-10, S = 10)."""
    return build_model(dictionary, attention_type=attention_type, input_feeding=input_feeding,
                       attention_mix=input_feeding, memory_position_encoding=attention_type.startswith("memory"),
                       memory_position_max_len=10)


def left_padded_batch(dictionary, sentences):
    """fairseq's collater layout: left-padded sources ending in EOS."""
    width = max(len(s) for s in sentences) + 1
    tokens = torch.full((len(sentences), width), dictionary.pad(), dtype=torch.long)
    for row, sent in enumerate(sentences):
        ids = [dictionary.index(str(t)) for t in sent] + [dictionary.eos()]
        tokens[row, width - len(ids):] = torch.tensor(ids)
    lengths = tokens.ne(dictionary.pad()).sum(1)
    return tokens, lengths


@pytest.fixture
def dictionary():
    return make_dictionary()


def once_per_run(tmp_path_factory, name, make):
    """``make(folder)`` once per pytest run, also across pytest-xdist workers: the first worker to
    need it makes it under a file lock, the others read its pickled result (pytest-xdist's way of
    running a session fixture once)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return make(tmp_path_factory.mktemp(name))
    folder = tmp_path_factory.getbasetemp().parent / name  # shared by the run's workers
    with FileLock(f"{folder}.lock"):
        done = folder / "result.pickle"
        if not done.exists():
            folder.mkdir(exist_ok=True)
            done.write_bytes(pickle.dumps(make(folder)))
        return pickle.loads(done.read_bytes())


@pytest.fixture(scope="session")
def own_pair_recipe(tmp_path_factory):
    """recipes/wmt17 on a user's own corpus of a pair the WMT'17 download does not
    have (toy en-fr, see wmt17_toy.py): prepare --raw-dir, train, evaluate.
    Trained once per pytest run for test_wmt17, test_hub, test_bible_converge and test_export."""
    import wmt17_toy

    return once_per_run(tmp_path_factory, "own-pair", lambda folder: wmt17_toy.prepare_train_evaluate(folder, "en-fr"))


@pytest.fixture(scope="session")
def own_pair_transformer(own_pair_recipe, tmp_path_factory):
    """The recipe's transformer_k64 configuration (toy sizes, wmt17_toy.TINY_TRANSFORMER)
    trained and evaluated on own_pair_recipe's prepared data, in its folders."""
    import wmt17_toy

    return once_per_run(tmp_path_factory, "own-pair-transformer", lambda _: wmt17_toy.prepare_train_evaluate(
        own_pair_recipe["root"], "en-fr", wmt17_toy.TINY_TRANSFORMER, config=wmt17_toy.TRANSFORMER_CONFIG))


# Sources of different lengths, so that sentences finish at different steps and
# SequenceGenerator drops finished ones from the batch.
BEAM_SOURCES = [[3, 4, 5, 6, 7, 8, 9], [8, 9], [5], [4, 4, 6, 7], [9, 8, 7, 6, 5]]


def beam_search(model, dictionary, beam=4, sources=BEAM_SOURCES):
    """fairseq's SequenceGenerator over a left-padded batch of ``sources``."""
    tokens, lengths = left_padded_batch(dictionary, sources)
    sample = {"id": torch.arange(len(sources)),
              "net_input": {"src_tokens": tokens, "src_lengths": lengths}}
    generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_b=12)
    with torch.no_grad():
        return generator.generate([model], sample)


def check_copies(out, min_bleu, min_accuracy, name):
    """fairseq-generate output on the copy task's 100 test examples: scored
    against the thresholds, alignments checked when printed."""
    from fairseq_memattn.score import read_generate_output, score

    result = score(*read_generate_output(out.splitlines()))
    print(f"{name} copy result:", result)
    assert result["sentences"] == 100
    assert result["bleu"] >= min_bleu and result["accuracy"] >= min_accuracy, result
    if re.search(r"^A-", out, re.M):
        check_alignment_lines(out)


def check_alignment_lines(out):
    """fairseq-generate --print-alignment output: one source position per
    target token, inside the source; an empty source has nothing to align to."""
    sources = dict(re.findall(r"^S-(\d+)\t(.*)$", out, re.M))
    hypotheses = {i: h for i, _, h in re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", out, re.M)}
    alignments = dict(re.findall(r"^A-(\d+)\t(.*)$", out, re.M))
    assert set(alignments) == set(hypotheses)
    for i, line in alignments.items():
        pairs = [tuple(map(int, p.split("-"))) for p in line.split()]
        n_src, n_hyp = len(sources[i].split()), len(hypotheses[i].split())
        assert len(pairs) == (n_hyp if n_src else 0)
        assert all(0 <= s < max(n_src, 1) and 0 <= t < n_hyp for s, t in pairs)


def without_language_pair(checkpoint, out):
    """``checkpoint`` as fairseq-train saves it when the pair came from the data folder's files."""
    state = torch.load(checkpoint, weights_only=False)
    state["cfg"]["task"]["source_lang"] = state["cfg"]["task"]["target_lang"] = None
    torch.save(state, out)
    return out
