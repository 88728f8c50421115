"""Gradient compressors as DDP communication hooks.

``get(name, **options) -> (state, hook)`` builds one, ready for ``ddp_model.register_comm_hook(state, hook)``
(or ``attach(ddp_model, state, hook)``, which also handles syncsgd's built-in mode); ``names()`` lists them.
Bad or inapplicable options raise a one-line ``ValueError`` naming the value and what is accepted.
Each state exposes ``warmup_iters`` (iterations before every step is compressed), ``stats`` (a
``runners.timing.CommStats`` the runner reads and resets each iteration), ``state_dict()``/``load_state_dict()``,
and the class attributes ``COLLECTIVE`` ("allreduce"|"allgather") and ``ROUNDS`` (dependent collectives per step),
``overlap`` (bool) and ``close()`` (stops powersgd's communication worker; call it before destroying the group).
"""

from __future__ import annotations

import importlib

from runners import catalog
from runners.compressors.base import CompressorState, FlatBucket

# one module per built-in compressor, named as the catalogue names it (runners/catalog.py: the one list of names)
_MODULES = {name: importlib.import_module(f"runners.compressors.{name}") for name in catalog.names()}

__all__ = ["get", "names", "options_of", "attach", "CompressorState", "FlatBucket"]


def names() -> list[str]:
    """The built-in compressors, from the torch-free catalogue (runners/catalog.py)."""
    return catalog.names()


def options_of(name: str) -> tuple[str, ...]:
    """The user options ``name`` accepts (runners/catalog.py; the state class lists the same in HYPERPARAMS)."""
    return catalog.options_of(name)


def _check_name(name: str) -> None:
    if name not in _MODULES:
        catalog.compressor(name)  # the catalogue's message


def is_plugin(name: str) -> bool:
    """A plugin spec MODULE:FACTORY (runners/plugins.py) rather than a built-in name."""
    return catalog.is_plugin_spec(name)


def get(name: str, process_group=None, overlap: bool = True, **options):
    """Build compressor ``name``: returns ``(state, hook)``. ``process_group`` None means the default group.
    ``overlap`` False: every collective is waited inside the hook (no overlap with backward); True: the hook
    returns un-waited (see base.py). Bitwise the same result either way.
    ``name`` may be a plugin ``MODULE:FACTORY`` (runners/plugins.py): its factory gets the options."""
    if catalog.is_plugin_spec(name):
        from runners import plugins

        return plugins.get(name, process_group=process_group, overlap=overlap, **options)
    _check_name(name)
    mod = _MODULES[name]
    accepted = mod.STATE.HYPERPARAMS
    for key in options:
        if key not in accepted:
            raise ValueError(
                f"option {key!r} does not apply to {name}; {name} accepts: {', '.join(accepted) or 'no options'}"
            )
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap {overlap!r} is not accepted: expected true or false")
    state = mod.STATE(process_group=process_group, **options)
    state.overlap = overlap
    return state, mod.HOOK


def attach(ddp_model, state: CompressorState, hook) -> None:
    """Register the hook on a DDP model; for syncsgd in builtin mode register nothing (DDP's C++ all-reduce) and
    record the dense gradient bytes for the payload accounting."""
    if getattr(state, "builtin", False):
        state.dense_bytes = sum(p.numel() * p.element_size() for p in ddp_model.module.parameters() if p.requires_grad)
        return
    ddp_model.register_comm_hook(state, hook)
