# The gradient norms of a copy-task checkpoint, per validation batch (by source length) and parameter:
#   python experiments/attention_check/grads.py CHECKPOINT
import math, sys, torch
from fairseq import checkpoint_utils, utils
utils.import_user_module(type("A", (), {"user_dir": "fairseq_memattn"})())
models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([sys.argv[1]])
m = models[0]; m.train()
task.load_dataset("valid")
batches = list(task.get_batch_iterator(task.dataset("valid"), max_sentences=64).next_epoch_itr(shuffle=False))
crit = task.build_criterion(cfg.criterion)
groups = {}
for batch in batches[::3]:
    m.zero_grad()
    loss, ss, log = crit(m, batch)
    (loss / ss).backward()
    srclen = batch["net_input"]["src_lengths"].float().mean().item()
    tot = math.sqrt(sum(p.grad.norm().item() ** 2 for p in m.parameters() if p.grad is not None))
    top = sorted(((p.grad.norm().item(), n) for n, p in m.named_parameters() if p.grad is not None), reverse=True)[:3]
    print(f"src len {srclen:5.1f} loss {loss.item()/ss/math.log(2):6.3f} bits  gnorm {tot:7.3f}  top: " + ", ".join(f"{n} {g:.3f}" for g, n in top))
