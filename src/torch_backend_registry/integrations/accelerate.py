"""Hugging Face accelerate: its ``DynamoBackend`` takes any name the registry resolves.

accelerate checks every backend name against its own enum, ``DynamoBackend`` (``'FAST' is not
a valid DynamoBackend``), wherever it reads one: ``TorchDynamoPlugin(backend=...)``,
``ACCELERATE_DYNAMO_BACKEND`` (which transformers' ``TrainingArguments(torch_compile_backend=...)``
sets for its Trainer), an accelerate config file's ``dynamo_config``. Importing this module
gives the enum a ``_missing_`` hook, Python's own for a value that is no member: a name the
registry resolves, in any case (accelerate upper-cases what it is given), becomes a member of
its own, whose value accelerate hands to ``torch.compile`` as the registry spells it, with
accelerate's ``mode``, ``fullgraph``, ``dynamic`` and ``options``. accelerate's own names are
members already and never reach the hook.

With ``TORCH_BACKENDS_AUTOLOAD=1``, this module is imported as soon as accelerate has defined
the enum: no code is needed. Without, :func:`dynamo_plugin` imports it::

    from accelerate import Accelerator
    from torch_backend_registry.integrations.accelerate import dynamo_plugin

    accelerator = Accelerator(dynamo_plugin=dynamo_plugin("portable", mode="max-autotune"))
"""

from __future__ import annotations

from typing import Any

from accelerate.utils.dataclasses import DynamoBackend, TorchDynamoPlugin

from .. import _api
from .._errors import UnknownBackendError
from .._registry import Registry

__all__ = ["UnknownDynamoBackendError", "dynamo_plugin"]


class UnknownDynamoBackendError(UnknownBackendError, ValueError):
    """accelerate was given a name that is neither its own nor the registry's. A
    ``ValueError`` as accelerate's own refusal is: ``name in DynamoBackend`` is ``False``, and
    ``accelerate launch`` says it its way. Its note names the manifests read."""


class _Exact(str):
    """A registry's name as a member's value. accelerate lower-cases the value it hands to
    ``torch.compile``; this one stays as the registry spells it. Pickled (a plugin sent to a
    spawned worker), it imports this module where it is unpickled, so that the name is a
    member there too."""

    def lower(self) -> str:
        return str(self)


def _missing(cls: Any, value: object) -> Any:
    """The member for ``value``, a name accelerate does not know (see the module's docstring)."""
    if not isinstance(value, str):
        return None  # accelerate's own error
    name = _ready(value)
    # A pseudo-member, as the enum module makes for a Flag's combinations: no member is
    # added to the enum, whose list of names stays accelerate's.
    member = str.__new__(cls, name)
    member._name_ = name.upper()
    member._value_ = _Exact(name)
    return member


def _ready(value: str) -> str:
    """The registry's name for ``value`` (case aside), made a torch.compile name in this
    process: the registry installed there (autoload's, or the one given to
    :func:`dynamo_plugin`), else the default one is installed. An unknown name raises
    :class:`UnknownDynamoBackendError` before anything compiles."""
    import torch._dynamo  # noqa: F401  # where autoload is on, it installs its registry here

    from .._torch import installed

    registry = installed() or _api.default_registry
    spelt = [known for known in registry.index().known if known.upper() == value.upper()]
    # Two names that differ only in case: the lower-case one, as accelerate would spell it.
    name = value if value in spelt else spelt[0] if len(spelt) == 1 else value.lower()
    try:
        registry.backend_info(name)
    except UnknownBackendError as exc:
        read = ", ".join(_api.manifests_read(registry)) or "no manifest"
        note = "; ".join(filter(None, (exc.note, f"read {read}")))
        raise UnknownDynamoBackendError(
            exc.name, exc.suggestions, note=note, left_out=exc.left_out
        ) from None
    if installed() is None:
        _api.install(registry)
    return name


DynamoBackend._missing_ = classmethod(_missing)


def dynamo_plugin(
    backend: str, *, registry: Registry | None = None, **kwargs: Any
) -> TorchDynamoPlugin:
    """accelerate's ``TorchDynamoPlugin``, compiling with ``backend``: any name ``registry``
    (the default one) resolves. ``kwargs`` are accelerate's own (``mode``, ``fullgraph``,
    ``dynamic``, ``options``, ``use_regional_compilation``).

    The registry's backends are installed into torch.compile (``install()``), so that
    accelerate's ``torch.compile(model, backend=name)`` finds the name; an unknown one raises
    :class:`UnknownDynamoBackendError` here. Sent to another process (a spawned worker, a
    pickle), the plugin installs the default registry there when it is unpickled, unless that
    process installed one already (autoload, its own ``install()``).
    """
    _api.install(registry)
    return TorchDynamoPlugin(backend=backend, **kwargs)
