"""What the answers' process sends the judge: a simulated run's results, statistics and trace, or the error it
raised, as JSON and raw tensor bytes; read back without pickle, into plain types only.

The answers' process runs the learner's code, so everything it sends is written by code the judge does not
trust: the judge reads it as data (numbers, strings, lists, dicts, tensors whose type is exactly torch.Tensor,
a module's named parameters), never as objects that could run code or lie about themselves when compared.
Messages travel framed (a length, then the bytes) over pipes; one larger than MESSAGE_BYTES is refused.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
import struct
import sys
from typing import Any, Optional

import torch

from lib.errors import PuzzleError, RankFailed
from lib.sim import Event, RankStats, SimResult

MESSAGE_BYTES = 512 * 2**20       # the most one message may hold (a run's results and trace)
_LENGTH = struct.Struct("!Q")
DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values()
          if isinstance(d, torch.dtype) and not d.is_complex and "q" not in str(d).removeprefix("torch.")[:2]}
DTYPES.update({str(d).removeprefix("torch."): d for d in (torch.complex64, torch.complex128)})


class Unreadable(PuzzleError):
    """A message from the answers' process that is not evidence of the expected form (a check that meets one
    fails, saying so)."""


# ---- framing -------------------------------------------------------------------------------------------------
def send(fd: int, payload: bytes) -> None:
    view = memoryview(_LENGTH.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def receive(fd: int, limit: int = MESSAGE_BYTES) -> Optional[bytes]:
    """The next message on `fd`, or None once the writer is gone (end of file)."""
    header = _read_exactly(fd, _LENGTH.size)
    if header is None:
        return None
    (length,) = _LENGTH.unpack(header)
    if length > limit:
        raise Unreadable(f"a message of {length} bytes, over the limit of {limit}")
    body = _read_exactly(fd, length)
    if body is None:
        return None
    return body


def _read_exactly(fd: int, count: int) -> Optional[bytes]:
    chunks, left = [], count
    while left:
        chunk = os.read(fd, min(left, 2**20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# ---- writing (in the answers' process) --------------------------------------------------------------------------
class _Writer:
    def __init__(self) -> None:
        self.blobs: list[bytes] = []

    def tensor(self, t: torch.Tensor) -> dict:
        with torch._C.DisableTorchFunctionSubclass():      # the values it holds, whatever its class says
            data = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
            grad = t.grad if t.is_leaf and t.grad is not None else None
            raw = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
        self.blobs.append(raw)
        return {"$tensor": [str(data.dtype).removeprefix("torch."), list(data.shape), len(self.blobs) - 1,
                            bool(t.requires_grad), None if grad is None else self.value(grad)]}

    def value(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return self.tensor(x)
        if isinstance(x, torch.nn.Module):
            params = [[name, self.tensor(p)] for name, p in x.named_parameters()]
            return {"$module": [type(x).__name__, params]}
        if x is None or isinstance(x, str):
            return str(x) if x is not None else None
        for kind in (bool, int, float):                       # subclasses as the number they stand for
            if isinstance(x, kind):
                return kind(x)
        if type(x).__module__ == "numpy" and hasattr(x, "item") and getattr(x, "ndim", None) == 0:
            return self.value(x.item())                       # numpy's scalars count as numbers in a check too
        if isinstance(x, torch.dtype):
            return {"$dtype": str(x).removeprefix("torch.")}
        if isinstance(x, tuple):
            return {"$tuple": [self.value(v) for v in x]}
        if isinstance(x, list):
            return [self.value(v) for v in x]
        if isinstance(x, dict):
            return {"$dict": [[self.value(k), self.value(v)] for k, v in x.items()]}
        return {"$opaque": [type(x).__name__, _safe_repr(x)]}


def _safe_repr(x: Any) -> str:
    try:
        return repr(x)[:200]
    except Exception:
        return f"<{type(x).__name__}>"


def _pack(header: dict, writer: _Writer) -> bytes:
    text = json.dumps({**header, "blobs": [len(b) for b in writer.blobs]}).encode()
    return _LENGTH.pack(len(text)) + text + b"".join(writer.blobs)


def result_message(result: SimResult) -> bytes:
    """A run that ended: its results, each rank's statistics and the trace."""
    w = _Writer()
    header = {"results": [w.value(r) for r in result.results],
              "stats": [{f.name: w.value(getattr(s, f.name)) for f in dataclasses.fields(RankStats)}
                        for s in result.stats],
              "trace": [[w.value(getattr(e, f.name)) for f in dataclasses.fields(Event)] for e in result.trace]}
    return _pack(header, w)


def error_message(error: BaseException) -> bytes:
    """A run that raised: what, said so that the judge can raise the same kind of error (lib.checker.puzzle tells a
    stub,
    a refusal the statement asks for, a mistake of the simulator's rules and any other error apart)."""
    header = {"error": {"classes": _classes(error), "text": str(error)[:20000],
                        "rank": getattr(error, "rank", None) if isinstance(error, RankFailed) else None,
                        "traceback": getattr(error, "traceback", "")[:20000] if isinstance(error, RankFailed) else "",
                        "raised": _raised(getattr(error, "exception", None)) if isinstance(error, RankFailed)
                        else None}}
    return _pack(header, _Writer())


def _classes(error: BaseException) -> list[list[str]]:
    return [[c.__module__, c.__qualname__] for c in type(error).__mro__ if issubclass(c, BaseException)]


def _raised(exception: Optional[BaseException]) -> Optional[dict]:
    if exception is None:
        return None
    return {"classes": _classes(exception), "args": [a if isinstance(a, (str, int, float)) else repr(a)[:2000]
                                                    for a in exception.args[:4]]}


# ---- reading (in the judge) ---------------------------------------------------------------------------------------
class ReceivedModule(torch.nn.Module):
    """A module's named parameters (and their gradients) as the answers' process sent them: what a check compares
    of a module."""

    def __init__(self, named: list[tuple[str, torch.Tensor]]) -> None:
        super().__init__()
        self._named = [(name, torch.nn.Parameter(t.detach(), requires_grad=t.requires_grad)) for name, t in named]
        for (_, p), (_, t) in zip(self._named, named):
            p.grad = t.grad

    def named_parameters(self, *args, **kwargs):
        return iter(self._named)

    def parameters(self, *args, **kwargs):
        return iter(p for _, p in self._named)


class Opaque:
    """A value of a kind a check never expects (an ndarray, an object of the learner's): equal to nothing,
    shown as it was."""

    def __init__(self, kind: str, text: str) -> None:
        self.kind, self.text = kind, text

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return self.text


class _Reader:
    def __init__(self, data: bytes, sizes: Any) -> None:
        if not (isinstance(sizes, list) and all(type(n) is int and n >= 0 for n in sizes)) or sum(sizes) != len(data):
            raise Unreadable("tensor bytes that do not add up")
        self.data, self.starts = data, [sum(sizes[:i]) for i in range(len(sizes) + 1)]

    def tensor(self, spec: Any) -> torch.Tensor:
        if not (isinstance(spec, list) and len(spec) == 5):
            raise Unreadable("a tensor described wrongly")
        dtype_name, shape, index, requires_grad, grad = spec
        dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
        if dtype is None or not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape) \
                or type(index) is not int or not 0 <= index < len(self.starts) - 1:
            raise Unreadable(f"a tensor of dtype {dtype_name!r} and shape {shape!r}")
        numel = 1
        for n in shape:
            numel *= n
        raw = self.data[self.starts[index]:self.starts[index + 1]]
        if len(raw) != numel * torch.empty((), dtype=dtype).element_size():
            raise Unreadable(f"a tensor of shape {shape} {dtype_name} in {len(raw)} bytes")
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone() if raw \
            else torch.empty(shape, dtype=dtype)
        if requires_grad is True and (t.is_floating_point() or t.is_complex()):
            t.requires_grad_(True)
        if grad is not None:
            g = self.value(grad)
            if type(g) is not torch.Tensor or g.shape != t.shape or g.dtype != t.dtype:
                raise Unreadable("a gradient unlike its tensor")
            t.grad = g
        return t

    def value(self, x: Any) -> Any:
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [self.value(v) for v in x]
        if not (isinstance(x, dict) and len(x) == 1):
            raise Unreadable(f"a value of the form {type(x).__name__}")
        (tag, body), = x.items()
        if tag == "$tensor":
            return self.tensor(body)
        if tag == "$tuple" and isinstance(body, list):
            return tuple(self.value(v) for v in body)
        if tag == "$dict" and isinstance(body, list) and all(isinstance(kv, list) and len(kv) == 2 for kv in body):
            items = [(self.value(k), self.value(v)) for k, v in body]
            if not all(isinstance(k, (str, int, float, bool, tuple)) or k is None for k, _ in items):
                raise Unreadable("a dict key of an unexpected kind")
            return dict(items)
        if tag == "$module" and isinstance(body, list) and len(body) == 2 and isinstance(body[0], str):
            named = [(n, self.tensor(spec["$tensor"])) for n, spec in body[1]
                     if isinstance(n, str) and isinstance(spec, dict) and "$tensor" in spec]
            kind = type(body[0][:100] if body[0].isidentifier() else "Module", (ReceivedModule,), {})
            return kind(named)
        if tag == "$dtype" and body in DTYPES:
            return DTYPES[body]
        if tag == "$opaque" and isinstance(body, list) and len(body) == 2 and all(isinstance(b, str) for b in body):
            return Opaque(body[0][:100], body[1][:200])
        raise Unreadable(f"a value tagged {tag!r}")


def _unpack(message: bytes) -> tuple[dict, _Reader]:
    if len(message) < _LENGTH.size:
        raise Unreadable("a message too short")
    (length,) = _LENGTH.unpack(message[:_LENGTH.size])
    try:
        header = json.loads(message[_LENGTH.size:_LENGTH.size + length])
    except (ValueError, RecursionError) as e:
        raise Unreadable(f"a message that is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise Unreadable("a message that is not a JSON object")
    return header, _Reader(message[_LENGTH.size + length:], header.get("blobs"))


def read_run(message: bytes, cost) -> tuple[Optional[SimResult], Optional[BaseException]]:
    """(the run's SimResult, or the error to raise in its place) from a message of the answers' process. Raises
    Unreadable for anything else."""
    header, reader = _unpack(message)
    try:
        if "error" in header:
            return None, _error(header["error"])
        results = reader.value(header["results"])
        stats = [RankStats(**{name: reader.value(v) for name, v in _fields(s, RankStats).items()})
                 for s in header["stats"]]
        trace = [Event(*[reader.value(v) for v in e]) for e in header["trace"]]
    except (KeyError, TypeError, ValueError, RuntimeError, RecursionError) as e:
        raise Unreadable(f"{type(e).__name__}: {e}"[:300]) from None
    if not isinstance(results, list) or len(results) != len(stats):
        raise Unreadable("results and statistics of different numbers of ranks")
    return SimResult(results, stats, trace, cost), None


def _fields(values: Any, cls: type) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    if not (isinstance(values, dict) and set(values) <= names):
        raise Unreadable(f"{cls.__name__} with fields {sorted(values) if isinstance(values, dict) else values!r}")
    return values


def _error(spec: Any) -> BaseException:
    """The error a run raised, as the judge's own exception: of the same class where the judge knows it (Python's,
    the course's), else of a class of the same name under the nearest one it knows."""
    if not isinstance(spec, dict) or not isinstance(spec.get("text"), str):
        raise Unreadable("an error described wrongly")
    cls = _known_class(spec.get("classes"))
    if issubclass(cls, RankFailed):
        raised = spec.get("raised")
        exception = None
        if isinstance(raised, dict) and isinstance(raised.get("args"), list):
            exception = _instance(_known_class(raised.get("classes")),
                                  [a for a in raised["args"] if isinstance(a, (str, int, float))][:4])
        error = _instance(RankFailed, [spec["text"]])
        error.rank = spec.get("rank") if isinstance(spec.get("rank"), int) else -1
        error.traceback = spec.get("traceback") if isinstance(spec.get("traceback"), str) else ""
        error.exception = exception
        error.kind = type(exception).__name__ if exception is not None else ""
        return error
    return _instance(cls, [spec["text"]])


def _instance(cls: type, args: list) -> BaseException:
    """An exception of `cls` holding `args`, made without running its __init__ (whose signature may differ)."""
    try:
        error = cls.__new__(cls)
        BaseException.__init__(error, *args)
    except Exception:
        error = type(cls.__name__, (Exception,), {"__module__": "answers"})(*args)
    return error


def _known_class(classes: Any) -> type:
    """The first class of `classes` ([module, qualified name], most derived first) the judge has, under the name
    of the first (so that an error of the learner's own class reads as it did); Exception at least."""
    if not (isinstance(classes, list) and classes and all(isinstance(c, list) and len(c) == 2 and
                                                          all(isinstance(p, str) for p in c) for c in classes)):
        raise Unreadable("the classes of an error described wrongly")
    for module, qualname in classes:
        found = _lookup(module, qualname)
        if found is not None:
            break
    else:
        found = Exception
    name = classes[0][1].rsplit(".", 1)[-1][:100]
    if found.__qualname__ != classes[0][1] and name.isidentifier():
        found = type(name, (found,), {"__module__": "answers"})
    return found


def _lookup(module: str, qualname: str) -> Optional[type]:
    """A class of Python's or of a module the judge imported already (nothing is imported for it), if it is an
    exception class."""
    if module == "builtins":
        found = getattr(builtins, qualname, None)
    elif module in sys.modules and module.split(".")[0] in ("lib", "puzzles", "torch"):
        found = sys.modules[module]
        for part in qualname.split("."):
            found = vars(found).get(part) if hasattr(found, "__dict__") else None
    else:
        found = None
    return found if isinstance(found, type) and issubclass(found, BaseException) and \
        not issubclass(found, (SystemExit, KeyboardInterrupt, GeneratorExit)) else None

