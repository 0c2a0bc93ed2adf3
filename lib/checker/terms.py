"""A prediction's reference written as named terms, so that a wrong prediction is named by its mistake.

A prediction puzzle (how many parameters, how many bytes, how many steps) builds its expected answer as an
expression of the case's quantities and named terms:

    h, V, S = Q("h", cfg.hidden, "the hidden size"), Q("V", cfg.vocab, "the vocabulary"), Q("s", cfg.seq, ...)
    total = term("the token embedding (V × h)", V * h) + term("the position embedding (s × h)", S * h) + ...
    Case(..., expected=[total.value], formulas={"": formula(total, "parameters")})

When the learner's number differs, `explain` tries the mistakes such a formula invites (a term left out or
counted twice, a quantity left out, off by one, or standing where another belongs; one or two at a time) and
names the first whose formula gives the learner's number: "512 parameters short: exactly the position embedding
(s × h), left out". No catalogue of wrong answers is needed: the mutations come from the formula's own structure.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Union

Number = Union[int, float]


class Expr:
    """A node of a formula; arithmetic on nodes (and plain numbers) builds larger ones."""

    def eval(self, change: dict) -> float:          # change: {id(node): function of the node's own value}
        raise NotImplementedError

    @property
    def value(self) -> float:
        return self.eval({})

    def children(self) -> tuple["Expr", ...]:
        return ()

    def nodes(self) -> Iterator["Expr"]:
        yield self
        for c in self.children():
            yield from c.nodes()

    def _at(self, change: dict, own: float) -> float:
        f = change.get(id(self))
        return own if f is None else f(own)

    def __add__(self, other): return Op("+", (self, lift(other)))
    def __radd__(self, other): return Op("+", (lift(other), self))
    def __sub__(self, other): return Op("-", (self, lift(other)))
    def __rsub__(self, other): return Op("-", (lift(other), self))
    def __mul__(self, other): return Op("×", (self, lift(other)))
    def __rmul__(self, other): return Op("×", (lift(other), self))
    def __truediv__(self, other): return Op("/", (self, lift(other)))
    def __rtruediv__(self, other): return Op("/", (lift(other), self))
    def __floordiv__(self, other): return Op("//", (self, lift(other)))
    def __neg__(self): return Op("-", (Num(0), self))


@dataclass(eq=False)
class Num(Expr):
    """A constant of the formula (2 bytes per bf16 value): not a quantity a learner could leave out."""

    number: Number

    def eval(self, change: dict) -> float:
        return self._at(change, float(self.number))


@dataclass(eq=False)
class Q(Expr):
    """A quantity of the case: the sequence length s, the world size N, the number of layers L."""

    symbol: str
    number: Number
    meaning: str = ""
    # Other values a learner may take it for, each with its words: ((2, "2 B a value, bfloat16's"),) for a float32's
    # 4 B, so that a prediction made with the other is named as that.
    alternatives: tuple = ()
    # What it measures ("B/s", "FLOP/s", "count"): a quantity is taken for another only of the same kind ("" for any),
    # so that no message says "F (the FLOP/s) where P (the parameters) belongs" because the two cancel alike.
    kind: str = ""

    def eval(self, change: dict) -> float:
        return self._at(change, float(self.number))

    @property
    def said(self) -> str:
        return f"{self.symbol} ({self.meaning})" if self.meaning else self.symbol


@dataclass(eq=False)
class Term(Expr):
    """A named part of a formula: what a learner may leave out or count twice."""

    name: str
    expr: Expr

    def eval(self, change: dict) -> float:
        return self._at(change, self.expr.eval(change))

    def children(self) -> tuple[Expr, ...]:
        return (self.expr,)


_OPS: dict[str, Callable[..., float]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "×": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else math.inf, "//": lambda a, b: a // b if b else math.inf,
    "ceil": lambda a: math.ceil(a) if math.isfinite(a) else a, "max": max, "min": min}


@dataclass(eq=False)
class Op(Expr):
    kind: str
    args: tuple[Expr, ...]

    def eval(self, change: dict) -> float:
        return self._at(change, _OPS[self.kind](*(a.eval(change) for a in self.args)))

    def children(self) -> tuple[Expr, ...]:
        return self.args


def lift(x: Union[Expr, Number]) -> Expr:
    return x if isinstance(x, Expr) else Num(x)


def term(name: str, expr: Union[Expr, Number]) -> Term:
    return Term(name, lift(expr))


def ceil(x: Union[Expr, Number]) -> Expr:
    return Op("ceil", (lift(x),))


def maximum(a: Union[Expr, Number], b: Union[Expr, Number]) -> Expr:
    return Op("max", (lift(a), lift(b)))


def minimum(a: Union[Expr, Number], b: Union[Expr, Number]) -> Expr:
    return Op("min", (lift(a), lift(b)))


@dataclass(frozen=True)
class Formula:
    """A reference's expression and the unit its value is in ("B", "parameters", "steps", "s")."""

    expr: Expr
    unit: str = ""

    @property
    def value(self) -> float:
        return self.expr.value

    def amount(self, x: float) -> str:
        return amount(x, self.unit)


def formula(expr: Union[Expr, Number], unit: str = "") -> Formula:
    return Formula(lift(expr), unit)


def amount(x: float, unit: str) -> str:
    """A number with its unit, as a learner reads it: 21,504 B (21.0 KiB), 512 parameters, 3.2 ms."""
    from lib.units import fmt_bytes, fmt_time

    if unit == "B":
        exact = f"{x:,.0f} B"
        return exact if abs(x) < 1024 else f"{exact} ({fmt_bytes(abs(x))})"
    if unit == "s":
        return fmt_time(x)
    shown = f"{x:,.0f}" if float(x).is_integer() else f"{x:,.6g}"
    if abs(x) == 1 and len(unit) > 1 and unit.endswith("s"):
        unit = unit[:-1]                                   # 1 step, 1 parameter: never "1 steps short"
    return f"{shown} {unit}".strip()


# ---- the mistakes a formula invites ------------------------------------------------------------------------
@dataclass(frozen=True)
class Mutation:
    """One change to a formula, said as the mistake it is: 'the position embedding (s × h) left out'."""

    said: str
    change: dict                  # {id(node): function of its value}


def mutations(expr: Expr) -> list[Mutation]:
    """The single mistakes the formula invites, simplest first."""
    terms = [n for n in expr.nodes() if isinstance(n, Term)]
    quantities: dict[str, list[Q]] = {}
    for n in expr.nodes():
        if isinstance(n, Q):
            quantities.setdefault(n.symbol, []).append(n)
    out = []
    for t in terms:
        out.append(Mutation(f"{t.name} left out", {id(t): lambda v: 0.0}))
    for t in terms:
        out.append(Mutation(f"{t.name} counted twice", {id(t): lambda v: 2 * v}))
    for symbol, nodes in quantities.items():
        said = nodes[0].said
        every = lambda f, nodes=nodes: {id(n): f for n in nodes}       # noqa: E731
        out.append(Mutation(f"{said} left out (taken as 1)", every(lambda v: 1.0)))
        for value, words in nodes[0].alternatives:
            out.append(Mutation(f"{words} where {said} belongs", every(lambda v, w=float(value): w)))
        for other, theirs in quantities.items():
            if other != symbol and theirs[0].number not in (nodes[0].number, 1) and (     # 1: "left out" says it
                    not theirs[0].kind or not nodes[0].kind or theirs[0].kind == nodes[0].kind):
                out.append(Mutation(f"{theirs[0].said} where {symbol} belongs",
                                    every(lambda v, w=float(theirs[0].number): w)))
        if float(nodes[0].number).is_integer():
            out.append(Mutation(f"{said} off by one ({symbol} - 1)", every(lambda v: v - 1)))
            out.append(Mutation(f"{said} off by one ({symbol} + 1)", every(lambda v: v + 1)))
        if len(nodes) > 1:               # one occurrence of several: the quantity left out of one place only
            for t in terms:
                inside = [n for n in t.nodes() if isinstance(n, Q) and n.symbol == symbol]
                if inside and len(inside) < len(nodes):
                    out.append(Mutation(f"{symbol} left out of {t.name}", {id(n): (lambda v: 1.0) for n in inside}))
    for n in expr.nodes():
        if isinstance(n, Op) and n.kind == "ceil":
            inner = n.args[0]
            out.append(Mutation("rounded down where it must round up (floor for ceil)",
                                {id(n): lambda v, inner=inner: float(math.floor(inner.value))}))
            out.append(Mutation("rounded to the nearest where it must round up (round for ceil)",
                                {id(n): lambda v, inner=inner: float(round(inner.value))}))
            out.append(Mutation("not rounded up (a fraction where a whole count belongs)",
                                {id(n): lambda v, inner=inner: inner.value}))
    return out


def matches(f: Formula, got: float, rel: float = 1e-9) -> list[str]:
    """The mistakes (one, else two together) whose formula gives `got`, simplest first; [] if none or if `got` is
    right."""
    if _same(got, f.value, rel):
        return []
    singles = mutations(f.expr)
    found = [m.said for m in singles if _gives(f.expr, m, got, rel)]
    if found:
        return found
    terms = [m for m in singles if m.said.endswith((" left out", " counted twice"))]
    pairs = (Mutation(f"{a.said}, and {b.said}", {**a.change, **b.change})
             for a, b in itertools.combinations(terms, 2) if not set(a.change) & set(b.change))
    first = _first(f.expr, pairs, got, rel)
    return [first.said] if first else []


def value_with(f: Formula, said: str) -> Optional[float]:
    """What the mistake `said` (as `matches` says it on another case) gives on this formula; None where it has no
    place here (the key/value heads where there are none, an untied head on a tied model)."""
    singles = mutations(f.expr)
    pairs = (Mutation(f"{a.said}, and {b.said}", {**a.change, **b.change})
             for a, b in itertools.combinations(singles, 2) if not set(a.change) & set(b.change))
    found = next((m for m in itertools.chain(singles, pairs) if m.said == said), None) or _left_out_of(f.expr, said)
    if found is None:
        return None
    try:
        return f.expr.eval(found.change)
    except (ArithmeticError, ValueError, OverflowError):
        return None


def _left_out_of(expr: Expr, said: str) -> Optional[Mutation]:
    """'tp left out of the model states' where tp is nowhere else: `mutations` says it 'tp left out (taken as 1)'
    there, the same mistake, which another case's formula (tp in the activations too) said the first way."""
    m = re.match(r"^(?P<symbol>\S+) left out of (?P<term>.+)$", said)
    if not m:
        return None
    inside = [n for t in expr.nodes() if isinstance(t, Term) and t.name == m["term"]
              for n in t.nodes() if isinstance(n, Q) and n.symbol == m["symbol"]]
    return Mutation(said, {id(n): (lambda v: 1.0) for n in inside}) if inside else None


def narrowed(found: list[str], answers: list[tuple[Formula, float]]) -> list[str]:
    """Of mistakes that give the learner's number on one case, those its answers to other cases (formula, answer)
    bear out: first those that give its wrong answers there, most often; then, of those, the ones that leave its
    right answers right (a mistake that has its place there and would change the number is not the learner's,
    unless every one would)."""
    def fitted(said: str) -> int:
        return sum(1 for f, got in answers if not _same(got, f.value, 1e-9)
                   and (v := value_with(f, said)) is not None and _same(v, got, 1e-9))

    def spoils(said: str) -> bool:
        return any(_same(got, f.value, 1e-9) and (v := value_with(f, said)) is not None and not _same(v, got, 1e-9)
                   for f, got in answers)
    best = max((fitted(x) for x in found), default=0)
    found = [x for x in found if fitted(x) == best]
    return [x for x in found if not spoils(x)] or found


def explain(f: Formula, got: float, rel: float = 1e-9,
            resolve: Optional[Callable[[list[str]], list[str]]] = None) -> Optional[str]:
    """The mistake whose formula gives `got`, said with the difference; None if none does. Where several fit this
    case (two terms of the same size), `resolve` keeps those that fit the learner's answers to other cases too;
    those left are all said."""
    found = matches(f, got, rel)
    if len(found) > 1 and resolve is not None:
        found = resolve(found) or found
    found = _one_way(found)
    if not found:
        return None
    diff = got - f.value
    side = f"{f.amount(abs(diff))} {'short' if diff < 0 else 'over'}"
    said = found[0] if len(found) == 1 else " or with ".join(found[:3]) + " (the same number on this case)"
    return f"your answer is {side}: it is what the formula gives with {said}."


_SWAP = re.compile(r"^(?P<a>\S+)(?: \(.*\))? where (?P<b>\S+) belongs$")


def _one_way(found: list[str]) -> list[str]:
    """A swap said both ways ("a where kv_heads belongs", "kv_heads where a belongs") said the first way only: where
    both give the learner's number, one quantity stands for the other, whichever way round it is read."""
    kept, seen = [], set()
    for x in found:
        m = _SWAP.match(x)
        if m and (m["b"], m["a"]) in seen:
            continue
        if m:
            seen.add((m["a"], m["b"]))
        kept.append(x)
    return kept


def _gives(expr: Expr, m: Mutation, got: float, rel: float) -> bool:
    try:
        return _same(expr.eval(m.change), got, rel)
    except (ArithmeticError, ValueError, OverflowError):
        return False


def _first(expr: Expr, candidates, got: float, rel: float) -> Optional[Mutation]:
    return next((m for m in candidates if _gives(expr, m, got, rel)), None)


def _same(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=max(rel, 1e-12), abs_tol=1e-9)
