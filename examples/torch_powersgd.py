"""PyTorch's own PowerSGD hook (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook) as a testbed plugin.

    testbed check-compressor torch_powersgd:make --plugin-path examples

It is here to be checked, not used: its hook issues the second and third all-reduce of a step from future callbacks,
so under rank-speed jitter on gloo, ranks issue collectives in different orders and the job crashes or hangs
(docs/compressors.md). The testbed's own `powersgd --flavour pytorch` runs the same arithmetic in a safe order.
"""

from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as _p


def make(
    process_group=None,
    rank: int = 1,
    start_iter: int = 2,
    min_compression_rate: float = 2.0,
    error_feedback: bool = True,
    warm_start: bool = True,
    seed: int = 0,
):
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"torch_powersgd rank {rank!r} is not accepted: expected an integer >= 1")
    state = _p.PowerSGDState(
        process_group=process_group,
        matrix_approximation_rank=rank,
        start_powerSGD_iter=start_iter,
        min_compression_rate=min_compression_rate,
        use_error_feedback=error_feedback,
        warm_start=warm_start,
        random_seed=seed,
    )
    return state, _p.powerSGD_hook
