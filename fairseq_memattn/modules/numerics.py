"""Small helpers the attention modules share: their options' checks for models built from Python,
half-precision-safe masking and sums."""

import torch
from torch import Tensor

from ..errors import UserError


def check_choice(name: str, value, choices) -> None:
    """argparse's "invalid choice" as a UserError, for modules built from Python."""
    if value not in choices:
        raise UserError(f"invalid {name}: {value!r} (choose from {', '.join(map(str, choices))})")


def check_positive_integer(name: str, value) -> None:
    """argparse's "invalid value" for an integer option >= 1, as a UserError (True is not 1)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"invalid {name}: {value!r} (must be an integer >= 1)")


def masked_fill_min(scores: Tensor, mask: Tensor) -> Tensor:
    """Fill masked scores with the dtype's most negative finite value.

    Unlike -inf this keeps a fully masked row finite under softmax (it becomes
    uniform instead of NaN), and it is representable in float16 and bfloat16.
    """
    # nan_to_num turns -inf into the dtype's most negative finite value, as
    # torch.finfo(dtype).min, which TorchScript does not have.
    lowest = torch.full((), float("-inf"), dtype=scores.dtype, device=scores.device).nan_to_num()
    return scores.masked_fill(mask, lowest)


def widen(x: Tensor) -> Tensor:
    """float16 and bfloat16 to float32; float32 and float64 unchanged (a no-op)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def sum_of_products(a: Tensor, b: Tensor) -> Tensor:
    """``torch.matmul(a, b)`` accumulated and returned in float32 (or wider).

    The sums of the attention (Eq. 1, 4, 6, Sec. 5 and the linear covariance) are
    reductions over up to |S| terms: in float16 a saturated Eq. 4-6 overflows
    (see the docstring of modules/memory.py), and in bfloat16 each rounding costs 3 digits. So they
    run in float32 for a half-precision model (--fp16, --bf16) and under
    autocast (--amp), which would otherwise cast matmul back to half; float32 and
    float64 inputs go through unchanged, with identical results.
    """
    if torch.jit.is_scripting():
        # TorchScript takes only constant devices here (and ignores autocast)
        with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            return torch.matmul(widen(a), widen(b))
    with torch.autocast(a.device.type, enabled=False):
        return torch.matmul(widen(a), widen(b))
