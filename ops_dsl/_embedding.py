"""Math shared by the embedding backward ops: rows of a gradient summed into a table."""

from opgen.dsl import scatter_add, where


def table_grad(grad, idx, rows, scale=None, keep=None):
    """``out[idx[n]] += scale[n] * grad[n]`` over a zero table of ``rows`` rows.

    ``scale`` is a per-row or scalar factor; rows where ``keep`` is false add nothing (their
    gradient is not even read, so a NaN there cannot leak in).
    """
    vals = grad if scale is None else grad * (scale if scale.ndim == 0 else scale[:, None])
    if keep is not None:
        vals = where(keep[:, None], vals, 0.0)
    return scatter_add(vals, idx, rows)
