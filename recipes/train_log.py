"""What a fairseq-train log says (validation curve, how and when training stopped) and
learning-curve plots: shared by the recipes (copy-task sweeps, real-data comparisons)."""

import logging
import math
import re
import shlex
import subprocess
from datetime import datetime


# fairseq-train now and then aborts in its teardown (SIGABRT, a C++ thread destroyed at exit; about 1
# run in 100 under load), after "done training" and its checkpoints: the run itself finished.
TEARDOWN_ABORT = "terminate called without an active exception"
ABORT_CODES = (-6, 134)  # SIGABRT as subprocess reports it, and as a shell does


def finished(code, log_text: str) -> bool:
    """Whether a fairseq-train run finished, from its exit code and what it logged (standard output
    and error): exit 0, or the teardown abort above after "done training"."""
    return code == 0 or (code in ABORT_CODES and TEARDOWN_ABORT in log_text
                         and "fairseq_cli.train | done training in" in log_text)


def run_logged(command, log_path, **popen) -> int:
    """Run a fairseq-train COMMAND with its line and its output appended to LOG_PATH; its exit
    status, 0 if it finished (``finished``, judged on this run's lines only: the log may hold
    earlier, resumed runs)."""
    with open(log_path, "a", encoding="utf-8") as log:
        log.write("$ " + shlex.join(command) + "\n")
        log.flush()
        start = log.tell()
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, **popen).returncode
    with open(log_path, encoding="utf-8") as log:
        log.seek(start)
        return 0 if finished(code, log.read()) else code


def read_train_log(path):
    """What a (possibly resumed, appended) train.log says: the validation curve [(updates, loss)],
    how training stopped ("converged": --patience; "cap": --max-update; "time": --stop-time-hours;
    None: not finished), the updates and epochs done, the wall-clock seconds of all its
    processes together, and the seconds of each epoch a process ran from its start.

    The seconds come from the log's timestamps (each process's first to last line), not from
    fairseq's ``wall`` meter, which a resumed fairseq-train restores as 0. A process paused
    (SIGSTOP) counts its pause in both; a median over the epochs does not."""
    curve, stopped, finished, epochs = {}, None, False, 0
    spans = []  # [first, last] timestamp of each fairseq-train process
    epoch_seconds = []
    with open(path) as f:
        for line in f:
            m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \|", line)
            if m:
                stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
                if not spans or "fairseq_cli.train | {" in line:
                    spans.append([stamp, stamp])
                    epoch_began = stamp
                spans[-1][1] = max(spans[-1][1], stamp)
                if "end of epoch" in line:
                    epoch_seconds.append((stamp - epoch_began).total_seconds())
                    epoch_began = stamp
            m = re.search(r"\| valid \|.*\| loss ([\d.]+) .*\| num_updates (\d+)", line)
            if m:
                curve[int(m.group(2))] = float(m.group(1))  # a resumed run may repeat an update count
            m = re.search(r"end of epoch (\d+) ", line)
            if m:
                epochs = max(epochs, int(m.group(1)))
            if "early stop since valid performance hasn't improved" in line:
                stopped = "converged"
            elif "Stopping training due to num_updates" in line:
                stopped = stopped or "cap"
            elif "Stopping training due to cumulative_training_time" in line:
                stopped = stopped or "time"
            elif "fairseq_cli.train | {" in line:  # a (re)start: an earlier stop does not count
                stopped, finished = None, False
            elif "done training in" in line:
                finished = True
    curve = sorted(curve.items())
    best = min(curve, key=lambda point: point[1]) if curve else (0, math.nan)
    return dict(curve=curve, stopped=stopped if finished else None, updates=curve[-1][0] if curve else 0,
                epochs=epochs,
                best_update=best[0], best_valid_loss=best[1],
                train_seconds=sum((last - first).total_seconds() for first, last in spans),
                epoch_seconds=epoch_seconds)


def plot_curves(path, title, curves):
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's logging set-up is verbose
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in curves.items():
        if curve:
            ax.plot(*zip(*curve), marker=".", label=label)
    ax.set(xlabel="training steps", ylabel="validation loss (base 2)", yscale="log", title=title)
    # Plain numbers at 1, 2, 5 x 10^n on the log axis, not matplotlib's 4x10^-1 minor labels.
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
