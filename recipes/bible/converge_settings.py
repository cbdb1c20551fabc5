"""What the convergence runs train and how: the pairs, each model's options (the LSTM gap's variants
among them) and GPU batches, the stopping rule, the checkpoints averaged and the conversion's runs;
for the drivers (converge.py, converge_cpu.py) and the results table (converged_table.py)."""

from recipes.bible import compare

PAIRS = {"transformer": "transformer_memattn", "lstm_att": "lstm_memattn"}  # baseline: memory model
MODELS = {
    "transformer": compare.MODELS["transformer"],
    # transformer_memattn with the architecture's defaults (attention read, position window), K = 64.
    "transformer_memattn": ["--arch", "transformer_memattn_iwslt_de_en", "--memory-k", "64",
                            *compare.SMALL_TRANSFORMER],
    "lstm_att": compare.MODELS["lstm_att"],
    "lstm_memattn": compare.MODELS["lstm_memattn"],  # Table 2's setting
}
# On a GPU, larger batches than compare.py's CPU ones, the same within a pair: 8,192 tokens for the
# Transformers (lr 1e-3, 1,000 warm-up updates), 256 sentences for the LSTMs (Adam 1e-3).
GPU_BATCH = {"transformer": ["--max-tokens", "8192"], "lstm_att": ["--batch-size", "256"]}
GPU_BATCH.update({memory: GPU_BATCH[baseline] for baseline, memory in PAIRS.items()})
# The LSTM gap's variants (docs/wmt17.md): a model of the LSTM pair with the options shown changed
# (one thing, or a content read, attention or general, on top of the mean-normalised encodings),
# trained with --models beside the pair and compared with it on validation, except FIXES.
VARIANTS = {
    "lstm_memattn_no_position": ("lstm_memattn", ["--no-memory-position-encoding"]),
    "lstm_memattn_position_mean": ("lstm_memattn", ["--memory-position-normalize", "mean"]),
    "lstm_memattn_k128": ("lstm_memattn", ["--memory-k", "128"]),
    "lstm_memattn_softmax_time": ("lstm_memattn", ["--memory-encoder-score", "softmax",
                                                   "--memory-encoder-normalize", "time"]),
    "lstm_memattn_sigmoid_read": ("lstm_memattn", ["--memory-decoder-score", "sigmoid"]),
    "lstm_memattn_input_feeding": ("lstm_memattn", ["--input-feeding"]),
    "lstm_memattn_attention_read": ("lstm_memattn", ["--memory-position-normalize", "mean",
                                                     "--memory-read", "attention"]),
    "lstm_memattn_general_read": ("lstm_memattn", ["--memory-position-normalize", "mean",
                                                   "--memory-read", "general"]),
    # transformer_memattn's write (softmax over time, the position window, no encodings) and its read
    "lstm_memattn_transformer_write": ("lstm_memattn", ["--no-memory-position-encoding", "--memory-encoder-score",
                                                        "softmax", "--memory-encoder-normalize", "time",
                                                        "--memory-position-window", "--memory-read", "attention"]),
    "lstm_memattn_attention_read_k128": ("lstm_memattn", ["--memory-position-normalize", "mean",
                                                          "--memory-read", "attention", "--memory-k", "128"]),
    "lstm_att_input_feeding": ("lstm_att", ["--input-feeding"]),
}
MODELS.update({name: [*MODELS[model], *changed] for name, (model, changed) in VARIANTS.items()})
GPU_BATCH.update({name: GPU_BATCH[model] for name, (model, _) in VARIANTS.items()})
LSTM_MODELS = ("lstm_att", "lstm_memattn", *VARIANTS)
PLOTTED_EXAMPLE = 5  # the validation example whose attention is drawn
# Validation every epoch; stop after PATIENCE epochs without a better validation loss.
PATIENCE = 5
AVERAGE_LAST = 5  # epoch checkpoints averaged
# The converged transformer converted and fine-tuned for these fractions of its updates, beside the
# transformer continued as long (recipes/convert/run.py's runs).
CONVERT_FRACTIONS = (0.05, 0.1)
CONVERT_RUNS = ("converted", "original")
