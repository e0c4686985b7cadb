"""A CUDA device simulated on the CPU (``--device sim``): the gate for device mistakes where no GPU is.

CI has no GPU, yet the suite audits code that trains on one. Under ``--device sim`` every tensor the
harness hands an operation is a :class:`DeviceTensor`: CPU memory that reports ``cuda:0``, keeps that
claim through every operation, and behaves as a CUDA tensor does where the CPU would be lenient:

* an operation that mixes it with a host tensor of one or more dimensions raises CUDA's error (a 0-dim
  host tensor is a scalar, which CUDA accepts; indexing and copies may cross devices, as on CUDA);
* a host ``torch.Generator`` handed to an operation on it raises, and so does a device generator
  (:class:`DeviceGenerator`) handed to an operation that makes host tensors;
* ``.numpy()`` and ``np.asarray`` raise, as they do on CUDA; ``.item()`` and ``.tolist()`` raise in
  the suite's own code (results reach the host through :func:`conformance_tests.harness.host`), but not
  inside the implementation, where they are legal (if slow) on a GPU;
* ``mean`` divides by multiplying with the reciprocal of the count, as CUDA's reduction kernels do, so a
  test that demands bit-equality with a CPU-computed mean fails here as it would on a GPU.

A :class:`torch.overrides.TorchFunctionMode` (:func:`simulate`) turns factory calls and ``.to``/``.cuda``
that name ``cuda:0`` into device tensors, and ``torch.Generator("cuda")`` into a :class:`DeviceGenerator`, so
device-generic code (``torch.zeros(n, device=x.device)``, ``module.to(device)``) runs unchanged. ``cuda:N``
for N > 0 is an invalid ordinal, as on a one-GPU machine.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode

DEVICE = torch.device("cuda", 0)
NAME = "sim"  # the --device value that selects this simulation

_Tensor = torch.Tensor
_NO_WRAP = torch.overrides.get_default_nowrap_functions() - {_Tensor.grad.__get__}
_SET_DATA = _Tensor.data.__set__
_PROPERTIES = {_Tensor.device.__get__: DEVICE, _Tensor.is_cuda.__get__: True, _Tensor.is_cpu.__get__: False}
_STATE = {"implementation_depth": 0, "simulating": False}


class SimulatedDeviceError(RuntimeError):
    """A device mistake that a real GPU would also reject (or that the suite forbids on one)."""


class DeviceGenerator(torch.Generator):
    """A generator "on the device": a CPU generator that reports ``cuda:0``."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return DEVICE


def _strip(x: Any) -> Any:
    return x.as_subclass(_Tensor) if isinstance(x, DeviceTensor) else x


def _wrap(out: Any) -> Any:
    if isinstance(out, _Tensor):
        return out if isinstance(out, DeviceTensor) else out.as_subclass(DeviceTensor)
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap(o) for o in out)
    return out


def _is_device(dev: Any) -> bool:
    """Whether ``dev`` names the simulated device; any other CUDA ordinal is an error, as on one GPU."""
    if dev is None:
        return False
    d = torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
    if d.type != "cuda":
        return False
    if d.index not in (None, 0):
        raise SimulatedDeviceError(f"CUDA error: invalid device ordinal ({d}; the simulated machine has one GPU)")
    return True


def _host_tensor(func, args: tuple, kwargs: dict) -> _Tensor | None:
    """A host tensor among the arguments that CUDA would refuse beside a device tensor. A 0-dim host tensor
    passes as a scalar to an elementwise operation, and to a ``_foreach_`` one; in a tensor list (``cat``,
    ``stack``) it does not."""
    foreach = _name(func).rpartition(".")[2].startswith("_foreach_")
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, (list, tuple)):
            bad = next((t for t in a if _is_host(t) and (t.dim() > 0 or not foreach)), None)
        else:
            bad = a if _is_host(a) and a.dim() > 0 else None
        if bad is not None:
            return bad
    return None


def _is_host(x: Any) -> bool:
    return isinstance(x, _Tensor) and not isinstance(x, DeviceTensor)


def _any_device(args: tuple, kwargs: dict) -> bool:
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, DeviceTensor) or (isinstance(a, (list, tuple)) and any(isinstance(t, DeviceTensor) for t in a)):
            return True
    return False


def _check_generator(func, args: tuple, kwargs: dict, *, on_device: bool) -> None:
    gen = kwargs.get("generator") or next((a for a in args if isinstance(a, torch.Generator)), None)
    if gen is None:
        return
    if on_device and not isinstance(gen, DeviceGenerator):
        raise SimulatedDeviceError(f"{_name(func)}: Expected a 'cuda' device type for generator but found 'cpu' "
                                   "(a host torch.Generator handed to an operation on the device)")
    if not on_device and isinstance(gen, DeviceGenerator):
        raise SimulatedDeviceError(f"{_name(func)}: Expected a 'cpu' device type for generator but found 'cuda' "
                                   "(a device generator handed to an operation that makes host tensors)")


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


@contextlib.contextmanager
def implementation_call() -> Iterator[None]:
    """Inside the implementation: ``.item()`` and ``.tolist()`` are legal there (a GPU allows them)."""
    _STATE["implementation_depth"] += 1
    try:
        yield
    finally:
        _STATE["implementation_depth"] -= 1


def _to_host(t: _Tensor, dtype: torch.dtype | None = None) -> _Tensor:
    """A host copy (a copy, as ``.cpu()`` of a CUDA tensor is) that stays on the autograd graph."""
    return _copy(t, dtype).as_subclass(_Tensor)


def _to_device(t: _Tensor, dtype: torch.dtype | None = None) -> "DeviceTensor":
    return _copy(t, dtype).as_subclass(DeviceTensor)


def _copy(t: _Tensor, dtype: torch.dtype | None = None) -> _Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        out = t if dtype is None else t.to(dtype)
        return out.clone() if out is t else out


def _to(func, args: tuple, kwargs: dict) -> Any:
    """``Tensor.to`` / ``.cuda()`` / ``.cpu()`` across the simulated boundary (both directions)."""
    self, rest, kwargs = args[0], args[1:], dict(kwargs)
    copy = bool(kwargs.pop("copy", False))
    if func is _Tensor.cpu:
        target, dtype = torch.device("cpu"), None
    elif func is _Tensor.cuda:
        target, dtype = (rest[0] if rest else kwargs.get("device")) or DEVICE, None
    elif rest and isinstance(rest[0], _Tensor):  # .to(other): other's device (as it reports it) and dtype
        target, dtype = rest[0].device, rest[0].dtype
    else:
        target, dtype, _, _ = torch._C._nn._parse_to(*rest, **kwargs)
    on_device = isinstance(self, DeviceTensor)
    going = on_device if target is None else _is_device(target)
    if going != on_device:
        return _to_device(self, dtype) if going else _to_host(self, dtype)
    if not on_device:
        return func(*args, **kwargs, **({"copy": True} if copy else {}))
    with torch._C.DisableTorchFunctionSubclass():
        out = _Tensor.to(self, dtype, copy=copy) if dtype is not None else (self.clone() if copy else self)
    return self if out is self else _wrap(out)


def _refuse_numpy(func, args, kwargs):
    raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
                    "memory first. (rlconform simulated device: a result reaches the host through harness.host())")


def _host_read(func, args, kwargs):
    if _STATE["implementation_depth"] == 0:
        raise SimulatedDeviceError(f"Tensor.{func.__name__}() on a device tensor in the suite's own code: results "
                                   "reach the host through conformance_tests.harness.host() (rlconform simulated device)")
    return func(_strip(args[0]), *args[1:], **kwargs)


def _text(func, args, kwargs):
    """repr/str/format of a device tensor: the host tensor's text, marked with the device."""
    text = func(_strip(args[0]), *args[1:], **kwargs)
    return text[:-1] + ", device='cuda:0')" if func is not _Tensor.__format__ and text.endswith(")") else text


def _mean(func, args, kwargs):
    """CUDA's mean: the sum times the reciprocal of the count (the CPU divides; the last bit can differ)."""
    x = args[0]
    if not x.is_floating_point() or x.numel() == 0:
        return _default(func, args, kwargs)
    total = torch.sum(*args, **kwargs)
    return total * (1.0 / (x.numel() // max(total.numel(), 1)))


def _deepcopy(func, args, kwargs):
    """A device copy (parameters stay parameters); the default needs ``new_empty`` to keep the subclass."""
    self, memo = args[0], args[1]
    if id(self) not in memo:
        with torch._C.DisableTorchFunctionSubclass():
            copy = self.detach().clone()
        copy = copy.as_subclass(DeviceTensor).requires_grad_(self.requires_grad)
        if getattr(self, "_is_param", False):
            copy._is_param = True
        memo[id(self)] = copy
    return memo[id(self)]


def _grad(func, args, kwargs):
    """``torch.autograd.grad``: each gradient on the device of its input (a host leaf's on the host)."""
    inputs = kwargs["inputs"] if "inputs" in kwargs else args[1]
    inputs = (inputs,) if isinstance(inputs, _Tensor) else tuple(inputs)
    with torch._C.DisableTorchFunctionSubclass():
        grads = func(*args, **kwargs)
    return tuple(_wrap(g) if isinstance(x, DeviceTensor) and g is not None else g for x, g in zip(inputs, grads))


def _set_data(func, args, kwargs):
    """``t.data = other`` across the boundary (``module.to(device)`` moves parameters this way): ``t`` moves
    with its data, keeping its identity, so optimisers and modules that hold it follow; a parameter stays
    one. (Not ``swap_module_params_on_conversion``: a global switch that breaks host modules with weakrefs.)"""
    self, value = args
    was_param = isinstance(self, torch.nn.Parameter)
    with torch._C.DisableTorchFunctionSubclass():
        func(self, _strip(value))
    if isinstance(value, DeviceTensor) != isinstance(self, DeviceTensor):
        self.__class__ = DeviceTensor if isinstance(value, DeviceTensor) else (
            torch.nn.Parameter if was_param else _Tensor)
        if was_param:
            self._is_param = True


def _crossing(func, args, kwargs):
    """Indexing and copies may take host tensors on CUDA (indices, a copied source)."""
    _check_generator(func, args, kwargs, on_device=True)
    return _call(func, args, kwargs)


def _call(func, args, kwargs):
    with torch._C.DisableTorchFunctionSubclass():
        out = func(*args, **kwargs)
    return out if func in _NO_WRAP else _wrap(out)


def _default(func, args, kwargs):
    host = _host_tensor(func, args, kwargs)
    if host is not None:
        raise SimulatedDeviceError(
            f"{_name(func)}: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
            f"cpu! (a host tensor of shape {tuple(host.shape)} met a device tensor; rlconform simulated device)")
    _check_generator(func, args, kwargs, on_device=True)
    return _call(func, args, kwargs)


_SPECIAL = {
    _Tensor.to: _to, _Tensor.cuda: _to, _Tensor.cpu: _to,
    _Tensor.numpy: _refuse_numpy, _Tensor.__array__: _refuse_numpy,
    _Tensor.item: _host_read, _Tensor.tolist: _host_read,
    _Tensor.__repr__: _text, _Tensor.__str__: _text, _Tensor.__format__: _text,
    torch.mean: _mean, _Tensor.mean: _mean,
    _Tensor.__getitem__: _crossing, _Tensor.__setitem__: _crossing, _Tensor.copy_: _crossing,
    _Tensor.__deepcopy__: _deepcopy, _Tensor.data.__set__: _set_data, _Tensor.module_load: _crossing,
    # autograd crosses devices (a host leaf gets the gradient of a device loss), as on CUDA
    torch.autograd.grad: _grad, torch.autograd.backward: _crossing, _Tensor.backward: _crossing, torch._has_compatible_shallow_copy_type: _crossing,
}


class DeviceTensor(torch.Tensor):
    """A CPU tensor that is, to every caller, a tensor on ``cuda:0`` (see the module's docstring)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _PROPERTIES:
            return _PROPERTIES[func]
        if func is _Tensor.get_device:
            return 0
        return _SPECIAL.get(func, _default)(func, args, kwargs)


class _Simulation(TorchFunctionMode):
    """Factories, ``.to`` and ``.cuda`` that name ``cuda:0`` make device tensors (on the CPU)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == _SET_DATA:  # dispatched on ``self`` alone: the subclass would not see a device value
            return _set_data(func, args, kwargs)
        if func in (_Tensor.to, _Tensor.cuda) and args and not isinstance(args[0], DeviceTensor):
            return _to(func, args, kwargs)
        if _is_device(kwargs.get("device")):
            _check_generator(func, args, kwargs, on_device=True)
            grad = kwargs.get("requires_grad", False)
            kwargs = {**kwargs, "device": "cpu", **({"requires_grad": False} if grad else {})}
            with torch._C.DisableTorchFunctionSubclass():
                out = _wrap(func(*args, **kwargs))
            return out.requires_grad_() if grad else out  # a leaf, as the factory makes it
        if not _any_device(args, kwargs):
            _check_generator(func, args, kwargs, on_device=False)
        return func(*args, **kwargs)


@contextlib.contextmanager
def simulate() -> Iterator[None]:
    """Run the block with ``cuda:0`` simulated on the CPU. Re-entrant: inside a simulation (a whole session
    under ``--device sim``) a nested one changes nothing."""
    from torch.utils import _foreach_utils

    if _STATE["simulating"]:  # a second mode would see the first one's host calls as a device mistake
        yield
        return
    torch.serialization.add_safe_globals([DeviceTensor])  # a saved device tensor loads back on the device
    kinds = _foreach_utils._foreach_supported_types  # torch picks foreach kernels by exact type, as on CUDA
    kinds.append(DeviceTensor)
    torch.Generator, _STATE["simulating"] = _Generator, True
    try:
        with _Simulation():
            yield
    finally:
        torch.Generator, _STATE["simulating"] = _REAL_GENERATOR, False
        kinds.remove(DeviceTensor)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """The block runs on the plain host, the simulation's mode off: for a test of host machinery that a
    function mode would get in the way of (TorchDynamo traces through an active mode)."""
    if not _STATE["simulating"]:
        yield
        return
    from torch.overrides import _pop_mode_temporarily

    with _pop_mode_temporarily() as mode:
        if not isinstance(mode, _Simulation):  # another mode on top: leave the stack as it was
            raise RuntimeError(f"cannot suspend the simulation under {type(mode).__name__}")
        yield


class _GeneratorOnSim(type(torch.Generator)):
    """The metaclass of :func:`simulate`'s ``torch.Generator``: any real generator is an instance of it."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _REAL_GENERATOR)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, _REAL_GENERATOR)


_REAL_GENERATOR = torch.Generator


class _Generator(_REAL_GENERATOR, metaclass=_GeneratorOnSim):
    """``torch.Generator(device)`` during :func:`simulate`: a :class:`DeviceGenerator` for ``cuda:0``, the
    real thing otherwise (a trainer builds its generator where its tensors live)."""

    def __new__(cls, device="cpu"):
        return DeviceGenerator() if _is_device(device) else _REAL_GENERATOR(device)


def generator(seed: int) -> DeviceGenerator:
    g = DeviceGenerator()
    g.manual_seed(seed)
    return g
