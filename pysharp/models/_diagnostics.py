"""A failed compile of a user's model header, told the way a user can act on it.

The compiler's output for one mistake in ``loss_grad`` runs to a hundred lines or more:
``loss_grad`` is instantiated on four or more types ``S`` (scalars, lane blocks, jets and
jets of lane blocks), each error comes with a chain of ``required from`` lines through
pysharp's engine, and a failed compile adds warnings of pysharp's own headers (-Wextra,
"used but never defined"). :func:`explain` puts the user's first error first (the line in
their file), adds a hint for the mistakes the tutorial warns about (``std::`` math on
``S``, ``if`` or ``&&`` on a comparison of ``S``, a misspelt name), and follows with the
compiler's output less the warnings of headers that are not the user's and the repeats
of an error at the same place for another ``S``.

Pure text processing of GCC's (or clang's) diagnostics: nothing here runs the compiler.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

#: ``file:line:col: severity: message`` (GCC and clang; the column is optional).
_MAIN = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? "
                   r"(?P<severity>fatal error|error|warning|note): (?P<message>.*)$")
#: A location in an instantiation chain: ``file:line:col:   required from ...``.
_CONTEXT_AT = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:\d+:)?\s+(?:required|"
                         r"in |\[ skipping)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[mK]")
#: The functions of pysharp that loss_grad may call on every S, by the <cmath> name a
#: user reaches for first.
_MATH = {name: f"{name}_" for name in ("sqrt", "exp", "expm1", "log", "log1p", "tanh",
                                         "sin", "cos")}
_OTHER_MATH = {
    "pow": "a product (x * x) for an integral power, sqrt_(x), or exp_(c * log_(x)) for x > 0",
    "abs": "select(x < Real(0), -x, x)",
    "fabs": "select(x < Real(0), -x, x)",
    "max": "select(a > b, a, b)",
    "min": "select(a < b, a, b)",
    "fmax": "select(a > b, a, b)",
    "fmin": "select(a < b, a, b)",
}
_CALL = re.compile(r"(?<![\w.>])(?:std::)?(?P<name>[a-z][a-z0-9]*)\s*\(")
_FUNCTIONS = "sqrt_, exp_, expm1_, log_, log1p_, tanh_, sin_, cos_"
_TABLE = ('docs/tutorials/own_model.rst, "What loss_grad may use"; or the top of '
          "pysharp/model.hpp")


@dataclasses.dataclass
class Diagnostic:
    """One error or warning with the lines the compiler printed before it (where it was
    included or instantiated from) and after it (the source line, carets, notes)."""

    context: list[str]
    main: str
    body: list[str]
    file: str
    line: int
    severity: str
    message: str

    def lines(self) -> list[str]:
        return [*self.context, self.main, *self.body]

    def snippet(self) -> list[str]:
        """The source line and carets printed right under the main line."""
        out = []
        for text in self.body:
            if not _is_snippet(text):
                break
            out.append(text)
        return out


def _is_snippet(text: str) -> bool:
    return bool(re.match(r"^\s+(\d+\s*)?\|", text)) or text.startswith("  +++ |")


def parse(stderr: str) -> tuple[list[Diagnostic], list[str]]:
    """The compiler's output as diagnostics, and the lines that belong to none (such as
    ``compilation terminated.``)."""
    diagnostics: list[Diagnostic] = []
    pending: list[str] = []
    for text in _ANSI.sub("", stderr).splitlines():
        m = _MAIN.match(text)
        if m and m["severity"] != "note":
            diagnostics.append(Diagnostic(pending, text, [], m["file"], int(m["line"]),
                                          m["severity"], m["message"]))
            pending = []
        elif diagnostics and (m or _is_snippet(text)):  # a note, or source and carets
            diagnostics[-1].body.extend([*pending, text])
            pending = []
        else:  # where the next diagnostic comes from
            pending.append(text)
    return diagnostics, pending


class _Files:
    """Which of the files named in the output are the user's: the header, the files it
    includes with quotes, and those in the user's include folders, unless they are in
    pysharp's (a built-in model's header loaded at run time)."""

    def __init__(self, user_files, user_dirs, own_dirs):
        self._files = {os.path.realpath(p) for p in user_files}
        self._dirs = [os.path.realpath(d) for d in user_dirs]
        self._own = [os.path.realpath(d) for d in own_dirs]
        self._lines: dict[str, list[str]] = {}

    def is_users(self, path: str) -> bool:
        real = Path(os.path.realpath(path))
        if any(real.is_relative_to(d) for d in self._own):
            return False
        return str(real) in self._files or any(real.is_relative_to(d) for d in self._dirs)

    def source_line(self, path: str, line: int) -> str:
        if path not in self._lines:
            try:
                self._lines[path] = Path(path).read_text(errors="replace").splitlines()
            except OSError:
                self._lines[path] = []
        lines = self._lines[path]
        return lines[line - 1] if 0 < line <= len(lines) else ""


def _user_location(d: Diagnostic, files: _Files) -> tuple[str, int] | None:
    """Where in the user's files diagnostic ``d`` arises: its own place, else the last
    ``required from`` (or clang's ``in instantiation ... requested here``) in their file."""
    if files.is_users(d.file):
        return d.file, d.line
    found = None
    for text in (*d.context, *d.body):
        m = _CONTEXT_AT.match(text) or _MAIN.match(text)
        if m and files.is_users(m["file"]):
            found = (m["file"], int(m["line"]))
    return found


def _hints(d: Diagnostic, source: str, in_users_file: bool) -> list[str]:
    """What the tutorial says about the mistake behind error ``d`` at user line ``source``
    (in the user's file itself, or in a header a line of theirs instantiated)."""
    hints = []
    message = d.message
    undeclared = re.search(r"‘(\w+)’ was not declared in this scope(?:; did you mean ‘(\w+)’)?"
                           r"|use of undeclared identifier '(\w+)'(?:; did you mean '(\w+)')?",
                           message)
    on_s = re.search(r"pysharp::(Jet|Lanes|LaneMask)|mask_t", message) is not None
    calls = [m["name"] for m in _CALL.finditer(source)]
    for name in dict.fromkeys(calls):
        if name in _MATH and (on_s or re.search(rf"‘{name}’|'{name}'", message)):
            hints.append(f"`{name}` of <cmath> takes a plain number, but loss_grad runs on "
                         f"jets and lane blocks too: write `{_MATH[name]}(x)`. pysharp's "
                         f"functions on every S: {_FUNCTIONS}.")
        elif name in _OTHER_MATH and on_s:
            hints.append(f"`std::{name}` does not take S (jets, lane blocks): write "
                         f"{_OTHER_MATH[name]}.")
    to_bool = re.search(r"to [‘']bool[’']|contextually convertible to 'bool'", message)
    if in_users_file and to_bool and re.search(r"LaneMask|mask_t", message):
        hints.append("a comparison of S gives mask_t<S>, one flag per lane (each lane of a "
                     "block is another point), not a bool: `if`, `?:` and `while` cannot "
                     "branch on it. Choose between values with select(mask, a, b); return "
                     "the mask of where the loss is defined. value_of(x) is the value part "
                     "of a jet, still one value per lane.")
    if re.search(r"operator(&&|\|\|)", message) and "LaneMask" in message:
        hints.append("masks combine with `&`, `|` and `!`, not `&&` and `||`.")
    if re.search(r"no match for ‘operator(<|>|<=|>=|==|!=)’|invalid operands to binary "
                 r"expression", message) and on_s:
        hints.append("compare S with S or with a Real constant (`z > Real(0)`); the mask "
                     "is mask_t<S>.")
    if undeclared:
        name, suggestion = undeclared[1] or undeclared[3], undeclared[2] or undeclared[4]
        if name in _MATH:
            hints.append(f"write `{_MATH[name]}(x)`: pysharp's functions on every S are "
                         f"{_FUNCTIONS}.")
        elif suggestion:
            hints.append(f"`{name}` is not declared; the compiler suggests `{suggestion}`.")
        else:
            hints.append(f"`{name}` is not declared: the names loss_grad may use are in "
                         f"{_TABLE}.")
    return hints


def explain(stderr: str, user_files, user_dirs=(), own_dirs=(), max_lines: int = 200) -> str:
    """The text of a failed compile for a user: their first error with a hint, then the
    compiler's output without the warnings of others' headers and without the repeats of
    an error at one place for other instantiations.

    Parameters
    ----------
    stderr : str
        The compiler's output.
    user_files, user_dirs : iterables of paths
        The user's files (the header and what it includes with quotes) and the include
        folders they passed.
    own_dirs : iterable of paths
        pysharp's include folders: never the user's.
    max_lines : int
        How many lines of the compiler's output to keep.
    """
    files = _Files(user_files, user_dirs, own_dirs)
    diagnostics, rest = parse(stderr)
    kept, seen, hidden, repeats = [], set(), 0, 0
    for d in diagnostics:
        if d.severity == "warning" and not files.is_users(d.file):
            hidden += 1
            continue
        where = (d.main.split(": ", 1)[0], d.severity)  # file:line:col
        if where in seen:
            repeats += 1
            continue
        seen.add(where)
        kept.append(d)
    errors = [d for d in kept if d.severity != "warning"]
    located = [(d, _user_location(d, files)) for d in errors]
    first, at = next(((d, loc) for d, loc in located if loc is not None),
                     (errors[0], None) if errors else (None, None))
    out = []
    if first is not None:
        if at is not None and (at[0], at[1]) != (first.file, first.line):
            out.append(f"{at[0]}:{at[1]}: here, in your header:")
            out.append(f"  {files.source_line(*at).strip()}")
        out.extend([first.main, *first.snippet()])
        with_s = [m[1] for text in first.context
                  if (m := re.search(r"\[with (S = [^;\]]+)", text))]
        if with_s:
            out.append(f"  (in the instantiation with {with_s[-1]})")
        hints = []
        for d, loc in located:
            source = files.source_line(*loc) if loc is not None else ""
            for hint in _hints(d, source, files.is_users(d.file)):
                if hint not in hints:
                    hints.append(hint)
        out.extend(f"hint: {h}" for h in hints)
        out.append("")
    left_out = []
    if hidden:
        left_out.append(f"{hidden} warning{'s' * (hidden > 1)} of pysharp's and the "
                        "libraries' headers")
    if repeats:
        left_out.append(f"{repeats} repeat{'s' * (repeats > 1)} of a diagnostic at the "
                        "same place (loss_grad is compiled for several types S)")
    out.append("The compiler's output" + (f" ({' and '.join(left_out)} left out)"
                                          if left_out else "") + ":")
    lines = [text for d in kept for text in d.lines()] + [t for t in rest if t.strip()]
    out.extend(lines[:max_lines])
    if len(lines) > max_lines:
        out.append(f"... ({len(lines) - max_lines} more lines)")
    return "\n".join(out)
