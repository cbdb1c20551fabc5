"""fairseq-memattn-export --quantize int8: every product with a constant weight quantizes its input per
row, so a sentence gets the same hypotheses alone as in any batch (Python API, command line, server),
and the product equals a numpy transcription of per-row quantization; the export's one-line error
without onnx. On the tiny models test_export.py trains. Skipped without onnx and onnxruntime."""

import json
import os
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import REPO, clean_env

pytest.importorskip("onnx", reason="the export needs the optional extra 'deploy' (onnx)")
ort = pytest.importorskip("onnxruntime", reason="the translator needs the optional extra 'deploy' (onnxruntime)")

from fairseq_memattn.deploy import TextCodec, Translator  # noqa: E402
from fairseq_memattn.export import export  # noqa: E402
from fairseq_memattn.export.graph import FLOAT, Graph  # noqa: E402
from test_export import SHORT_SOURCE_ROWS, short_source_rows, trained  # noqa: E402,F401  (the session's trained models)

# Sources of one length (no padding in a batch) and of mixed lengths, as id lists ending in EOS.
SAME_LENGTH = [[4 + (i * 7 + j * 3) % 10 for j in range(6)] + [2] for i in range(24)]
MIXED = [[4 + (i * 7 + j) % 10 for j in range(i % 8 + 1)] + [2] for i in range(24)]
SEARCH = dict(beam=4, max_len_a=1.0, max_len_b=2)

_exports = {}


@pytest.fixture(scope="module")
def int8_export(trained, tmp_path_factory):  # noqa: F811
    """The int8 export of a variant of test_export.py, made on first use."""

    def get(variant):
        if variant not in _exports:
            out = tmp_path_factory.mktemp(f"int8-{variant}") / "onnx"
            export(str(trained(variant)[0]), str(out), quantize="int8", short_source_rows=short_source_rows(variant))
            _exports[variant] = str(out)
        return _exports[variant]

    return get


def text(ids):
    return " ".join(str(i - 4) for i in ids[:-1])  # the copy task's symbols "0".."9" are ids 4..13


def test_int8_product_quantizes_each_row_on_its_own():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((48, 40)).astype(np.float32)
    weight[:, 3] = 0  # an all-zero column
    x = rng.standard_normal((2, 5, 48)).astype(np.float32)
    x[0, 1] = 0  # a padding row
    x[1, 2] *= 1000  # an outlier row: another row's scale must not see it
    g = Graph("product", quantize="int8")
    g.output(g.product(g.input("x", FLOAT, [2, 5, 48]), weight), "y", FLOAT, [2, 5, 40])
    session = ort.InferenceSession(g.model().SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0]

    column_max = np.maximum(np.abs(weight).max(axis=0), 1e-30)
    w_int8 = np.rint(weight * (63 / column_max)).astype(np.int64)  # 7 bits: no int16 overflow without VNNI
    expected = np.zeros((2, 5, 40), np.float32)
    for b in range(2):
        for row in range(5):
            row_max = max(np.abs(x[b, row]).max(), np.float32(1e-30))
            x_int8 = np.clip(np.rint(x[b, row] / row_max * 127), -127, 127).astype(np.int64)
            expected[b, row] = (x_int8 @ w_int8) * row_max * column_max / (127 * 63)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.all(got[0, 1] == 0) and np.all(got[:, :, 3] == 0)
    np.testing.assert_allclose(got, x @ weight, rtol=0.05, atol=0.05 * np.abs(x @ weight).max())


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["attention", "lstm", "lstm-feeding-pe", "mix-per-layer-pe"])
def test_int8_gives_a_sentence_the_same_hypotheses_alone_as_in_a_batch(int8_export, variant):
    translator = Translator(int8_export(variant), threads=1)
    for sources in (SAME_LENGTH, MIXED):  # MIXED: padded in a batch, not alone
        batch = translator.translate_ids(sources, **SEARCH)
        for source, together in zip(sources, batch):
            alone = translator.translate_ids([source], **SEARCH)[0]
            assert [h["tokens"].tolist() for h in alone] == [h["tokens"].tolist() for h in together], source
            for a, b in zip(alone, together):
                assert a["score"] == b["score"]
                np.testing.assert_array_equal(a["positional_scores"], b["positional_scores"])


@pytest.mark.slow
def test_int8_decoder_reads_short_sources_at_one_width_in_any_batch(int8_export, monkeypatch):
    """The short sources' memory (one symbol and EOS here) spans short_source_rows - 1 positions alone,
    beside a longer short source and in the whole batch: the same products whatever the CPU's kernels."""
    from fairseq_memattn.deploy import translator as translator_module

    translator = Translator(int8_export("attention"), threads=1)
    widths, real = [], translator_module.DecoderRun

    def recorded(*args, short=None, **kwargs):
        widths.append(short["alpha"].shape[2])  # rows x memories x S x K
        return real(*args, short=short, **kwargs)

    monkeypatch.setattr(translator_module, "DecoderRun", recorded)
    for sources in ([MIXED[0]], [MIXED[0], MIXED[1]], MIXED):
        translator.translate_ids(sources, **SEARCH)
    assert widths == [SHORT_SOURCE_ROWS - 1] * 3


def translate_cli(folder, lines, *options):
    result = subprocess.run([sys.executable, "-m", "fairseq_memattn.deploy", folder, "--beam", "4", "--threads", "1", "--max-len-a", "1",
                             "--max-len-b", "2", *options], input="".join(f"{line}\n" for line in lines), env=clean_env(), cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.slow
def test_int8_cli_prints_the_same_lines_for_any_buffer_size(int8_export):
    folder = int8_export("attention")
    same = [text(s) for s in SAME_LENGTH]
    assert translate_cli(folder, same, "--buffer-size", "1") == translate_cli(folder, same, "--buffer-size", "1000")
    mixed = [text(s) for s in MIXED]
    assert translate_cli(folder, mixed, "--buffer-size", "1") == translate_cli(folder, mixed, "--buffer-size", "1000")


class Counting(Translator):
    """A Translator that keeps the size of each batch the server hands it."""

    def translate_ids(self, sources, **options):
        self.batches.append(len(sources))
        return super().translate_ids(sources, **options)


@pytest.mark.slow
def test_int8_server_answers_a_sentence_as_the_translator_alone(int8_export):
    pytest.importorskip("aiohttp", reason="the server needs the optional extra 'serve' (aiohttp)")
    from fairseq_memattn.deploy.serve import BackgroundServer, make_app

    translator = Counting(int8_export("attention"), threads=1)
    translator.batches = []
    options = dict(lenpen=1.0, max_len_a=1.0, max_len_b=2, min_len=1, unk_penalty=0.0, normalize_scores=True)
    app = make_app(translator, TextCodec(translator.src_dict, translator.tgt_dict), options, beam=4, window=0.05)

    def post(line):
        request = urllib.request.Request(f"{server.url}/translate", data=json.dumps({"text": [line]}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)["results"][0][0]

    with BackgroundServer(app) as server, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, [text(s) for s in SAME_LENGTH]))
    assert max(translator.batches) > 1  # sentences were decoded together
    for source, answer in zip(SAME_LENGTH, answers):
        alone = Translator.translate_ids(translator, [source], **SEARCH)[0][0]
        assert answer["pieces"] == translator.tgt_dict.string(alone["tokens"])
        assert answer["score"] == float(alone["score"])


def test_export_without_onnx_names_onnx_in_one_line(tmp_path):
    code = ("import sys; sys.modules['onnx'] = None; import runpy; sys.argv[0] = 'fairseq-memattn-export'; "
            "runpy.run_module('fairseq_memattn.export', run_name='__main__', alter_sys=True)")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "checkpoint.pt"), str(tmp_path / "out")],
                            env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "fairseq-memattn-export: error: the export needs onnx, which is not installed: pip install onnx onnxruntime"), \
        result.stderr
    assert not os.path.exists(tmp_path / "out")
