"""fairseq's hub API on the WMT'17 recipe's output, loaded exactly as the
docs/wmt17.md shows: MemAttnLSTMModel.from_pretrained(checkpoint folder, data-bin,
sentencepiece model) -> translate / sample / generate with alignments.

The model is the tiny en-fr one that conftest.own_pair_recipe trains through
recipes/wmt17 (prepare --raw-dir, train, evaluate) in its default folders."""

import math
import os
import re
import subprocess

import numpy as np
import pytest
import torch
from conftest import BIN, PLUGIN_DIR, REPO, clean_env
from fairseq.hub_utils import GeneratorHubInterface

from test_transformer_memattn import alignment_by_loops
from wmt17_toy import CONFIG, TRANSFORMER_CONFIG

from fairseq_memattn.hub import MemAttnHubInterface
from fairseq_memattn.models.lstm_memattn import MemAttnLSTMModel
from fairseq_memattn.models.transformer_memattn import MemAttnTransformerModel

pytestmark = pytest.mark.slow  # every test here starts a command line or trains (docs/testing.md)

SENTENCES = ["The dog sees the house.", "Red bird.", "The old horse has the green apple."]


@pytest.fixture(scope="module")
def recipe_dir(own_pair_recipe):
    return own_pair_recipe["root"]


def from_pretrained(model_class, recipe_dir, config):
    cwd = os.getcwd()
    os.chdir(recipe_dir)  # the relative paths of docs/wmt17.md
    try:
        model = model_class.from_pretrained(
            f"checkpoints/wmt17/en-fr/{config}", checkpoint_file="checkpoint_best.pt",
            data_name_or_path="data/wmt17/en-fr/data-bin",
            bpe="sentencepiece", sentencepiece_model="data/wmt17/en-fr/spm.model")
    finally:
        os.chdir(cwd)
    model.eval()
    return model


@pytest.fixture(scope="module")
def model(recipe_dir):
    return from_pretrained(MemAttnLSTMModel, recipe_dir, "k32_pe_sigmoid-softmax")


def interactive(recipe_dir, beam, sentences=SENTENCES, config="k32_pe_sigmoid-softmax"):
    """fairseq-interactive's D- lines for raw sentences: the same checkpoint through fairseq's CLI."""
    result = subprocess.run(
        [os.path.join(BIN, "fairseq-interactive"), "data/wmt17/en-fr/data-bin", "--user-dir", PLUGIN_DIR,
         "--path", f"checkpoints/wmt17/en-fr/{config}/checkpoint_best.pt",
         "--source-lang", "en", "--target-lang", "fr", "--bpe", "sentencepiece",
         "--sentencepiece-model", "data/wmt17/en-fr/spm.model", "--beam", str(beam), "--cpu"],
        cwd=recipe_dir, input="".join(s + "\n" for s in sentences), env=clean_env(OMP_NUM_THREADS="1"),
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return re.findall(r"^D-\d+\t\S+\t(.*)$", result.stdout, re.M)


def test_from_pretrained_returns_fairseqs_hub_interface(model):
    assert isinstance(model, GeneratorHubInterface)
    assert isinstance(model.models[0], MemAttnLSTMModel)
    assert (model.task.source_dictionary is model.src_dict and model.task.cfg.source_lang == "en"
            and model.task.cfg.target_lang == "fr")
    assert model.cfg.bpe._name == "sentencepiece"


def test_translate_and_sample_give_what_fairseq_interactive_gives(model, recipe_dir):
    """Raw text in, plain text out, hypothesis for hypothesis the same as the CLI's
    (which applies the same sentencepiece model, beam and checkpoint)."""
    translations = model.translate(SENTENCES, beam=10)
    print("hub translate:", translations)
    assert translations == interactive(recipe_dir, beam=10)
    assert model.translate(SENTENCES[0], beam=10) == translations[0]  # one string in, one out
    assert model.sample(SENTENCES) == interactive(recipe_dir, beam=1)  # sample: beam 1
    assert plain_text(translations)


def plain_text(translations):
    """Whether every translation is non-empty, its BPE removed."""
    return all(t and "▁" not in t for t in translations)


def aligned_source_positions(alignment):
    """How many source positions a hard alignment uses."""
    return len(set(s for s, _ in alignment))


def eq10_position_encodings(length, K, S):
    """Eq. 10, l_ks = (1 - k/K)(1 - s/S) + (k/K)(s/S), each context k renormalised
    over the sentence's positions s (Sec. 3.2), written as loops."""
    L = [[(1 - k / K) * (1 - s / S) + (k / K) * (s / S) for k in range(1, K + 1)]
         for s in range(1, length + 1)]
    totals = [sum(L[s][k] for s in range(length)) for k in range(K)]
    return torch.tensor([[L[s][k] / totals[k] for k in range(K)] for s in range(length)])


def beta_alpha(model, source, target):
    """beta alpha^T (T x S) for one sentence, from the encoder states s_t and the
    decoder states h_i of a teacher-forced forward pass: alpha_t = sigmoid(W_alpha s_t o l_t)
    (Eq. 5, 9, 10; the recipe's sigmoid encoder scores), beta_i = softmax(W_beta h_i) (Eq. 7)."""
    network, cfg = model.models[0], model.cfg.model
    attention = network.encoder.attention
    captured = {}
    build_memory = attention.build_memory

    def recording_build_memory(states, padding_mask):
        captured["s"] = states[0]
        return build_memory(states, padding_mask)

    attention.build_memory = recording_build_memory
    hook = network.decoder.lstm.register_forward_hook(lambda m, i, out: captured.update(h=out[0][0]))
    try:
        prev_output = torch.cat([target.new_tensor([model.tgt_dict.eos()]), target[:-1]])
        with torch.no_grad():
            network(source[None], torch.tensor([source.numel()]), prev_output[None])
    finally:
        hook.remove()
        del attention.build_memory
    W_alpha, W_beta = attention.writer.W_alpha.weight, attention.read.W_beta.weight
    l = eq10_position_encodings(source.numel(), cfg.memory_k, cfg.memory_position_max_len)
    alpha = torch.sigmoid((captured["s"] @ W_alpha.T) * l)
    beta = torch.softmax(captured["h"] @ W_beta.T, dim=-1)
    return beta @ alpha.T


def test_alignments_are_beta_alpha_transposed(model):
    source = model.encode(SENTENCES[2])
    translation = model.translate(SENTENCES[2], beam=10)
    best = model.generate(source, beam=10, print_alignment="hard")[0]
    assert model.decode(best["tokens"]) == translation  # alignments do not change the search
    expected = beta_alpha(model, source, best["tokens"])  # T x S, EOS included on both sides
    attention = best["attention"].T
    assert attention.shape == expected.shape == (best["tokens"].numel(), source.numel())
    torch.testing.assert_close(attention, expected, atol=1e-5, rtol=1e-4)
    # hard: each target token (EOS excluded) to its most attended source token (EOS excluded)
    words = expected[:-1, :-1]
    assert best["alignment"] == [(int(words[i].argmax()), i) for i in range(words.size(0))]
    assert aligned_source_positions(best["alignment"]) > 1  # not one column for every token

    assert model.generate(source, beam=10, print_alignment=True)[0]["alignment"] == best["alignment"]
    soft = model.generate(source, beam=10, print_alignment="soft")[0]["alignment"]
    torch.testing.assert_close(torch.tensor([[float(p) for p in row] for row in soft]),
                               expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"invalid print_alignment: 'bogus' \(choose from 'hard', 'soft', True\)"):
        model.generate(source, beam=10, print_alignment="bogus")


@pytest.mark.parametrize("settings, message", [
    (dict(beam=0), "invalid beam: 0 (must be an integer >= 1)"),
    (dict(beam="5"), "invalid beam: '5' (must be an integer >= 1)"),
    (dict(beam=2.5), "invalid beam: 2.5 (must be an integer >= 1)"),
    (dict(lenpen=float("nan")), "invalid lenpen: nan (must be a finite number)"),
    (dict(temperature=0.0), "invalid temperature: 0.0 (must be a finite number > 0)"),
    (dict(diverse_beam_groups=3), "invalid diverse_beam_groups: 3 (must be a divisor of beam 5, or -1 for none)"),
    (dict(sampling=True, match_source_len=True), "sampling and match_source_len choose other searches"),
    (dict(max_len_a=-1.0), "invalid max_len_a: -1 (must be a finite number >= 0)"),
    (dict(max_len_b=-5), "invalid max_len_b: -5 (must be >= min_len 1)"),
    (dict(min_len=500), "invalid max_len_b: 200 (must be >= min_len 500)"),
    (dict(unkpen=-math.inf), "invalid unkpen: -inf (must be a number, inf to ban <unk>)"),
    (dict(sampling_topk=10), "sampling_topk 10 samples: give sampling too, or leave it out"),
    (dict(sampling=True, sampling_topk="5"), "invalid sampling_topk: '5' (must be an integer, -1 for none)"),
    (dict(sampling=True, sampling_topp="0.9"), "invalid sampling_topp: '0.9' (must be a number, -1 for none)"),
    (dict(beem=5), "unknown generation setting(s): beem (did you mean beam?) (the settings are fairseq's"),
])
def test_search_settings_fairseq_would_fail_on_or_ignore_are_named(model, settings, message):
    """Before the search: fairseq's beam search fails deep inside on them (beam=0: a reshape of 0
    elements), ranks by NaN, or takes a misspelt name as a new attribute and ignores it."""
    with pytest.raises(ValueError) as refused:
        model.translate(SENTENCES[1], **{"beam": 5, **settings})
    assert str(refused.value).startswith(message), str(refused.value)


def test_search_settings_fairseq_takes_pass(model):
    """numpy's and torch's scalars, floats where fairseq takes them, inf to ban <unk>, a negative b
    with a > 0: fairseq decodes with each, so they must not be refused."""
    for settings in (dict(beam=np.int64(4)), dict(beam=torch.tensor(4), lenpen=torch.tensor(0.5)),
                     dict(max_len_b=50.0, min_len=2.0), dict(max_len_a=2.0, max_len_b=-2),
                     dict(sampling=True, sampling_topk=3), dict(diversity_rate=0.0), dict(diverse_beam_groups=2)):
        model.check_settings(settings.pop("beam", 4), settings)
    assert isinstance(model.translate(SENTENCES[1], beam=np.int64(2), unkpen=math.inf, max_len_b=50.0), str)


def test_alignments_only_for_the_call_that_asks(model):
    """translate() does not pay for alignments: the decoders go back to not
    returning attention, as fairseq-generate without --print-alignment."""
    decoder = model.models[0].decoder
    model.generate(model.encode(SENTENCES[1]), beam=2, print_alignment="hard")
    assert not decoder.need_attn and not decoder.attention.keep_alignment
    assert model.generate(model.encode(SENTENCES[1]), beam=2)[0]["attention"].numel() == 0


# --- transformer_memattn: the recipe's transformer_k64 configuration (toy sizes) ------

@pytest.fixture(scope="module")
def transformer(own_pair_transformer):
    return from_pretrained(MemAttnTransformerModel, own_pair_transformer["root"], TRANSFORMER_CONFIG)


def test_transformer_from_pretrained_gives_the_same_hub_interface(transformer, recipe_dir):
    assert type(transformer) is MemAttnHubInterface
    assert isinstance(transformer.models[0], MemAttnTransformerModel)
    assert transformer.cfg.bpe._name == "sentencepiece" and transformer.task.cfg.target_lang == "fr"
    translations = transformer.translate(SENTENCES, beam=10)
    print("hub translate (transformer_k64):", translations)
    assert translations == interactive(recipe_dir, beam=10, config=TRANSFORMER_CONFIG)
    assert transformer.sample(SENTENCES) == interactive(recipe_dir, beam=1, config=TRANSFORMER_CONFIG)
    assert plain_text(translations)


def test_transformer_alignments_are_read_weights_times_alpha_transposed(transformer):
    network = transformer.models[0]
    source = transformer.encode(SENTENCES[2])
    translation = transformer.translate(SENTENCES[2], beam=10)
    best = transformer.generate(source, beam=10, print_alignment="hard")[0]
    assert transformer.decode(best["tokens"]) == translation  # alignments do not change the search
    expected = alignment_by_loops(network, source, best["tokens"], transformer.tgt_dict.eos())
    attention = best["attention"].T  # T x S, EOS included on both sides
    assert attention.shape == expected.shape == (best["tokens"].numel(), source.numel())
    torch.testing.assert_close(attention, expected, atol=1e-5, rtol=1e-4)
    words = expected[:-1, :-1]
    assert best["alignment"] == [(int(words[i].argmax()), i) for i in range(words.size(0))]
    soft = transformer.generate(source, beam=10, print_alignment="soft")[0]["alignment"]
    torch.testing.assert_close(torch.tensor([[float(p) for p in row] for row in soft]),
                               expected, atol=1e-5, rtol=0)
    # only for the call that asks: back to no alpha, as fairseq-generate without --print-alignment
    assert network.encoder.alignment_request is False and not network.encoder.keep_alignment
    assert transformer.generate(source, beam=2)[0]["attention"].numel() == 0


def test_install_message_names_the_fairseq_that_setup_py_pins(tmp_path):
    """With a fairseq that is installed but does not import (PyPI's 0.12.2 on Python 3.11), the
    plugin's registration says which fairseq to install, the one setup.py's extra pins. (Without any fairseq
    it imports for the ONNX runtime alone: tests/test_deploy.py.)"""
    broken = tmp_path / "fairseq"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ValueError('mutable default for field common')\n")
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    result = subprocess.run([os.path.join(BIN, "python"), "-c",
                             "import fairseq_memattn; fairseq_memattn.register()"],
                            env=env, capture_output=True, text=True, timeout=120)
    pin = re.search(r"pip install (ve-fairseq==[\d.]+)\)", result.stderr)
    assert result.returncode != 0 and pin, result.stderr[-2000:]
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
        assert f'"ve-fairseq": ["{pin.group(1)}"]' in f.read()


@pytest.mark.parametrize("model_class", [MemAttnLSTMModel, MemAttnTransformerModel])
def test_from_pretrained_names_a_checkpoint_given_as_the_folder_and_a_missing_folder(tmp_path, model_class):
    checkpoint = tmp_path / "checkpoint_best.pt"
    checkpoint.write_text("")
    with pytest.raises(ValueError) as error:
        model_class.from_pretrained(str(checkpoint), data_name_or_path=str(tmp_path))
    assert str(error.value) == (f"{checkpoint} is a file: give its folder and its name apart, "
                                f"from_pretrained({str(tmp_path)!r}, checkpoint_file='checkpoint_best.pt', ...)")
    with pytest.raises(ValueError) as error:
        model_class.from_pretrained(str(tmp_path / "nope"), checkpoint_file="x.pt", data_name_or_path=str(tmp_path))
    assert str(error.value) == f"model folder not found: {tmp_path / 'nope'} (from_pretrained takes the folder " \
                               "that holds checkpoint_file='x.pt')"


def test_from_pretrained_names_a_data_folder_it_cannot_use(recipe_dir, tmp_path):
    folder = os.path.join(recipe_dir, "checkpoints", "wmt17", "en-fr", "k32_pe_sigmoid-softmax")
    for data, options, expected in [
            (tmp_path / "nope", {}, f"data folder not found: {tmp_path / 'nope'} (data_name_or_path is the data-bin "
                                    "folder the model was trained on, with its dictionaries)"),
            (tmp_path, {},
             f"{tmp_path} has no dict.en.txt; give data_name_or_path=, the data-bin folder the model was trained on"),
            (tmp_path, dict(source_lang=None, target_lang=None),  # as trained without --source-lang/--target-lang
             f"{tmp_path} has no fairseq-preprocess output (train.SRC-TGT.SRC.idx) to tell the language pair from; "
             "give data_name_or_path=, the data-bin folder the model was trained on, or source_lang= and "
             "target_lang= with its dictionaries")]:
        with pytest.raises(ValueError) as error:
            MemAttnLSTMModel.from_pretrained(folder, checkpoint_file="checkpoint_best.pt", data_name_or_path=str(data),
                                             **options)
        assert str(error.value) == expected


def test_a_keyword_argument_that_does_not_fit_the_checkpoint_is_named_as_given(recipe_dir, own_pair_transformer):
    """from_pretrained(..., memory_k=4) for a K = 8 checkpoint: the error names the keyword argument,
    not --model-overrides, fairseq's command-line name for what the hub passes on."""
    for model_class, config in ((MemAttnLSTMModel, CONFIG), (MemAttnTransformerModel, TRANSFORMER_CONFIG)):
        folder = os.path.join(own_pair_transformer["root"], "checkpoints", "wmt17", "en-fr", config)
        with pytest.raises(ValueError) as error:
            model_class.from_pretrained(folder, checkpoint_file="checkpoint_best.pt", memory_k=4,
                                        data_name_or_path=os.path.join(recipe_dir, "data", "wmt17", "en-fr", "data-bin"))
        assert str(error.value) == (
            f"{os.path.join(folder, 'checkpoint_best.pt')} does not fit the model: checkpoint has memory_k=8 but "
            "from_pretrained was given memory_k=4; remove memory_k=4 from from_pretrained's keyword arguments")
