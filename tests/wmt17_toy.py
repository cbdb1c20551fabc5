"""Toy parallel corpora and the WMT'17 recipe run on them offline (prepare.sh
--raw-dir, train.sh, evaluate.sh), for test_wmt17 and test_hub.

The toy languages translate English word for word, so that a tiny model learns
them in seconds: "The dog sees the house." -> "Die Hund sieht die Haus." (de),
"Le chien voit le maison." (fr).
"""

import os
import random
import subprocess

from conftest import BIN, REPO, clean_env

LEXICONS = {
    lang: dict(pair.split(":") for pair in words.split())
    for lang, words in {
        "de": "the:die house:Haus tree:Baum river:Fluss stone:Stein light:Licht cloud:Wolke night:Nacht "
              "water:Wasser green:grün small:klein old:alt red:rot blue:blau cold:kalt warm:warm dog:Hund "
              "cat:Katze bird:Vogel fish:Fisch horse:Pferd apple:Apfel bread:Brot milk:Milch book:Buch "
              "door:Tür road:Straße city:Stadt field:Feld garden:Garten sees:sieht has:hat",
        "fr": "the:le house:maison tree:arbre river:rivière stone:pierre light:lumière cloud:nuage "
              "night:nuit water:eau green:vert small:petit old:vieux red:rouge blue:bleu cold:froid "
              "warm:chaud dog:chien cat:chat bird:oiseau fish:poisson horse:cheval apple:pomme "
              "bread:pain milk:lait book:livre door:porte road:route city:ville field:champ "
              "garden:jardin sees:voit has:a",
    }.items()
}
SIZES = {"train": 2000, "valid": 40, "test": 60}
TINY_TRAINING = ["--dropout", "0", "--lr", "5e-3", "--clip-norm", "1", "--batch-size", "32", "--max-epoch", "10",
                 "--validate-interval-updates", "0", "--save-interval-updates", "0",
                 "--eval-bleu-args", '{"beam": 5}', "--no-progress-bar", "--log-interval", "50",
                 "--seed", "1", "--num-workers", "0"]
TINY_MODEL = ["--encoder-hidden-size", "64", "--decoder-hidden-size", "64", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--memory-k", "8", *TINY_TRAINING]
CONFIG = "k32_pe_sigmoid-softmax"
# transformer_k64 at toy sizes: 2+2 layers of 32 units, 2 heads, K = 8, a short warm-up.
TINY_TRANSFORMER = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
                    "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim",
                    "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
                    "--memory-k", "8", "--warmup-updates", "100", *TINY_TRAINING]
TRANSFORMER_CONFIG = "transformer_k64"


def sentence(rng, lexicon):
    words = [rng.choice(list(lexicon)) for _ in range(rng.randint(2, 8))]
    target = " ".join(lexicon[w] for w in words)
    return " ".join(words).capitalize() + ".", target[0].upper() + target[1:] + "."


def write_corpus(raw, sizes=SIZES, seed=1, pair="en-de"):
    """{split}.{src,tgt} of the toy language named by the pair's target code."""
    src, tgt = pair.split("-")
    rng = random.Random(seed)
    raw.mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        pairs = [sentence(rng, LEXICONS[tgt]) for _ in range(n)]
        for side, lang in enumerate((src, tgt)):
            (raw / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    return raw


def recipe(script, *args, check=True, threads="1", cwd=None):
    result = subprocess.run(["bash", os.path.join(REPO, "recipes", "wmt17", script), *args], cwd=cwd,
                            env=clean_env(OMP_NUM_THREADS=threads, PYTHON=os.path.join(BIN, "python")),
                            capture_output=True, text=True, timeout=600)
    if check:
        assert result.returncode == 0, f"{script} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def prepare_train_evaluate(root, pair, model_args=TINY_MODEL, threads="1", config=CONFIG):
    """The recipe after its download step, run in ROOT with its default output
    folders, on a toy corpus in ROOT/raw: data in ROOT/data/wmt17/PAIR,
    checkpoints in ROOT/checkpoints/wmt17/PAIR/CONFIG; each step's CompletedProcess.
    Run again in the same ROOT for another configuration, prepare skips its finished steps."""
    raw = write_corpus(root / "raw", pair=pair)
    prepared = recipe("prepare.sh", pair, "--raw-dir", "raw", "--vocab-size", "200", threads=threads, cwd=root)
    trained = recipe("train.sh", pair, config, "--gpus", "0", *model_args, threads=threads, cwd=root)
    checkpoint = root / "checkpoints" / "wmt17" / pair / config / "checkpoint_best.pt"
    evaluated = recipe("evaluate.sh", pair, str(checkpoint.relative_to(root)), "--gpus", "0",
                       threads=threads, cwd=root)
    return dict(root=root, raw=raw, out=root / "data" / "wmt17" / pair, prepared=prepared, trained=trained,
                checkpoint=checkpoint, evaluated=evaluated)
