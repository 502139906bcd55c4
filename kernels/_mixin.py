"""The mixed-in forward ``kernels.patch`` gives a module without swapping it: a class made of a mixin and the
module's own class (``isinstance`` still holds), state kept in the module's ``__dict__``, undone by ``unpatch``.

``kernels.nn`` mixes in ``FusedMLP`` and ``FusedRMSNorm``; ``kernels.hf`` mixes transformers' routers and attention
modules. Both import this module, which imports neither.
"""

from __future__ import annotations

from typing import Any

from torch import nn


class _MixedIn:
    """What ``FusedMLP``, ``FusedRMSNorm`` (kernels/nn.py), ``FusedTopKRouter`` and ``RotaryAttention``
    (kernels/hf.py) share: ``patch`` mixes one into a module's own class
    (``_mixed_class``: ``isinstance`` still holds) and keeps its state in the module's ``__dict__`` under the
    names ``_STATE`` lists, which ``unpatch`` drops with the class."""

    _unfused: type  # the module's own class
    _STATE: tuple[str, ...] = ()

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickled (and deep-copied) as the module's own class: a class made at patch time cannot be found by
        # name when a pickle is loaded.
        state = {name: value for name, value in self.__getstate__().items() if name not in self._STATE}
        return _new_module, (type(self)._unfused,), state


_MIXED_CLASSES: dict[tuple[type, type], type] = {}


def _mixed_class(mixin: type, cls: type) -> type:
    mixed = _MIXED_CLASSES.get((mixin, cls))
    if mixed is None:
        mixed = _MIXED_CLASSES[(mixin, cls)] = type(f"Fused{cls.__name__}", (mixin, cls),
                                                    {"_unfused": cls, "__module__": cls.__module__})
    return mixed


def _new_module(cls: type) -> nn.Module:
    """An empty instance of ``cls``, for a pickle's state to fill (as copyreg.__newobj__ makes one)."""
    return cls.__new__(cls)
