"""A fairseq ``--user-dir`` that trains only the write (Eq. 4-5) of a ``transformer_memattn``:
fairseq_memattn, plus every other parameter's gradient dropped as soon as it is computed, so the
optimizer skips it (no step, no weight decay) while its parameter list and state keep the layout
of a full run: fine-tuning continues from, and into, ordinary checkpoints."""

import fairseq_memattn  # noqa: F401  registers the models
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq_memattn.convert import MEMATTN_ARCH, WRITE_PREFIX


def drop_gradient(parameter):
    parameter.grad = None


def freeze_all_but_the_write(model):
    for name, parameter in model.named_parameters():
        if not name.startswith(WRITE_PREFIX):
            parameter.register_post_accumulate_grad_hook(drop_gradient)
    return model


model_class = ARCH_MODEL_REGISTRY[MEMATTN_ARCH]
build_full_model = model_class.build_model.__func__
model_class.build_model = classmethod(lambda cls, args, task: freeze_all_but_the_write(build_full_model(cls, args, task)))
