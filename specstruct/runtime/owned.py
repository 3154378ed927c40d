"""The modules the runtime computes with, and what it records about them, without changing the user's.

Switching a model to row-invariant numerics (model_runtime.make_row_invariant) rebinds Linear forwards, packs
weights, fuses decoder layers and routes the attention through the packed one. A runtime does that to a module it
owns: one specstruct loaded for an engine (`hand_over`), a copy it made itself, or one already switched. Any other
module -- a user's `nn.Module` passed to `SpecStruct(model, ...)` -- is first copied by `structural_copy`: new module
objects, configs and Parameter objects over the same tensors, so the user's module, its state dict, forwards and
attributes stay exactly as they were, and no weight is copied until the runtime packs it.

What the runtime records about a module (its numerics, its row-wise attention, a draft's own numerics) is kept in
`marks`, beside the module rather than on it.
"""

from __future__ import annotations

import copy
import functools
import types
import weakref
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

_HANDED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


@dataclass
class Marks:
    """What the runtime knows about one module it switched or made."""

    numerics: str | None = None  # make_row_invariant's description, once switched
    attention: str | None = None  # its row-wise attention kernel ("cpp" or "torch"), chosen once
    draft_numerics: str | None = None  # an int8 draft's own description
    rows_coupled: bool = False  # a row's result depends on the other rows of its call (torch.ao's dynamic int8)
    weight_grad: bool = False  # a packed Linear's weight required grad before packing (unpacking restores it)


_MARKS: weakref.WeakKeyDictionary[torch.nn.Module, Marks] = weakref.WeakKeyDictionary()


def marks(module: torch.nn.Module) -> Marks:
    """The module's marks (empty ones the first time)."""
    found = _MARKS.get(module)
    if found is None:
        found = _MARKS[module] = Marks()
    return found


def peek(module: torch.nn.Module) -> Marks:
    """The module's marks without recording any (empty ones where it has none)."""
    return _MARKS.get(module) or Marks()


def forget(module: torch.nn.Module) -> None:
    """Drop the module's marks (restore_stock)."""
    _MARKS.pop(module, None)


def hand_over(*modules: torch.nn.Module | None) -> None:
    """Give these modules to the runtime, to switch in place: specstruct loaded them and no one else holds them
    (SpecStruct.from_pretrained), or the runtime made them (quantize_draft)."""
    for module in modules:
        if module is not None:
            _HANDED.add(module)


def owned(module: torch.nn.Module) -> bool:
    """Whether the runtime may change `module` in place: handed over, or switched already."""
    return module in _HANDED or peek(module).numerics is not None


def own(module: torch.nn.Module) -> torch.nn.Module:
    """`module` itself where the runtime owns it, else its structural copy (handed over)."""
    if owned(module):
        return module
    mine = structural_copy(module)
    hand_over(mine)
    return mine


def structural_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module`'s tree that shares its tensors: every submodule a new object with its own attribute,
    parameter, buffer and hook dicts, every config a copy (shared where the original shares one), every Parameter
    a new Parameter over the same tensor (tied ones stay tied). Assigning anything on the copy -- a forward, a
    weight, a parameter's `.data`, a config field -- leaves `module` as it was; in-place arithmetic on a shared
    tensor would not, and the runtime does none."""
    clones: dict[int, torch.nn.Module] = {}
    params: dict[int, torch.nn.Parameter] = {}
    configs: dict[int, object] = {}

    def parameter(p: torch.nn.Parameter | None) -> torch.nn.Parameter | None:
        if p is None or type(p) is not torch.nn.Parameter:
            return p  # a tensor subclass of specstruct's own (packed) is only ever on an owned module
        if id(p) not in params:
            params[id(p)] = torch.nn.Parameter(p.data, requires_grad=p.requires_grad)
        return params[id(p)]

    def clone(mod: torch.nn.Module) -> torch.nn.Module:
        if id(mod) in clones:
            return clones[id(mod)]
        new = type(mod).__new__(type(mod))
        clones[id(mod)] = new
        state = dict(mod.__dict__)
        for key, value in state.items():
            if isinstance(value, (dict, list, set)):
                state[key] = copy.copy(value)
        state["_parameters"] = {k: parameter(p) for k, p in mod._parameters.items()}
        state["_modules"] = {k: None if m is None else clone(m) for k, m in mod._modules.items()}
        config = state.get("config")
        if isinstance(config, PretrainedConfig):  # the attention implementation is read from it at each call
            state["config"] = configs.setdefault(id(config), copy.deepcopy(config))
        new.__dict__.update(state)
        return new

    root = clone(module)
    for mod in clones.values():  # forwards bound to an original module (a user's override) move to its copy
        for key, value in list(mod.__dict__.items()):
            if isinstance(value, types.MethodType) and id(value.__self__) in clones:
                mod.__dict__[key] = types.MethodType(value.__func__, clones[id(value.__self__)])
            elif isinstance(value, functools.partial) and value.args and id(value.args[0]) in clones:
                mod.__dict__[key] = functools.partial(value.func, clones[id(value.args[0])], *value.args[1:],
                                                      **value.keywords)
    return root
