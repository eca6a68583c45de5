"""The sandbox chat templates run in (chat.py renders with it): transformers' environment, with a bound on the time
and the memory of every rendering, since a template is untrusted code (a nested loop rendered for ever, and
`{{ 'a' * 4000000000 }}` took 4-5 GB).

- The environment: jinja2's ImmutableSandboxedEnvironment as transformers' `_compile_jinja_template` builds it
  (chat.py's module docstring).
- Time (TemplateLimits): the template's own work, CPU time of the rendering thread (time.thread_time), not the
  wall clock, so that other processes on a loaded machine never make a rendering late. The bound of one
  conversation's renderings together is `seconds` plus `seconds_per_message` for each message rendered (a
  conversation of n messages rendered once allows n of them; the prefix renderings of chat.py allow what they
  render), so that it scales with the conversation's size. Checked at every call, operator, filter and output piece
  (the wall clock first, a cheap bound: a thread's CPU time cannot run ahead of it), and, in a process's main
  thread (prepare's workers, the CLI), by an ITIMER_PROF alarm on the process's CPU time that interrupts a loop
  doing none of those (it re-arms itself while the thread's own CPU time is within the bound, and after it
  raised, until the rendering is left: an Exceeded raised in a gc callback or a __del__ is lost). Signal handlers only
  run in the main thread; elsewhere only the checks bound the time.
- Memory (TemplateLimits.chars): no string, list or output the template builds may exceed it. Operations whose
  result can be far larger than their operands are checked BEFORE they run: `*` (repetition), `**`, `%`
  formatting widths, `str.format` widths, `center`/`ljust`/`rjust`/`zfill`/`expandtabs`/`replace`/`join` (methods
  and filters), `indent`, `wordwrap`, `sum`, `tojson` and `strftime_now`; every other call, `*`/`**`/`%` and
  filter result, the output, every `{% set %}`/macro buffer and every `~` concatenation are checked as they are
  made (each is at most a few times its already bounded inputs; `+` is not even intercepted, as its result is kept
  only through a namespace, a call or the output). A value stored in a namespace or passed to a call may not
  hold more than `chars` elements counted as a tree (a list that holds itself twice, 32 levels deep, would print
  and compare as 2^32 elements).
- Speed, with the same answers as jinja2's sandbox: an item of a plain dict read as an attribute (`message.role`)
  without the failed attribute lookup first, is_safe_attribute remembered per (type, name) for the builtin value
  types, the loop and the namespace (its answer depends on nothing else), and the loop variables jinja2 adds to
  every call inside a loop not measured at each call (the callee never receives them).
A rendering that exceeds a bound raises Exceeded (a BaseException, so that neither jinja2 nor the template can
swallow it); chat.py turns it into a bad line (`template_limit`) or a ChatError. The bounds themselves
(TemplateLimits, Budget, `limited`'s alarm) are chat_budget.py.
"""
from __future__ import annotations

import functools
import json
import re
from datetime import datetime

from minilmd.corpus.chat_budget import Budget, Exceeded, TemplateLimits

MIN_JINJA = (3, 1, 6)  # transformers' floor: older jinja2 has known sandbox escapes, and templates are untrusted code


_PRINTF_WIDTH = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_printf(budget: Budget, fmt: str, args) -> None:
    """`fmt % args`: no field width or precision beyond the bound (a `*` takes its width from args)."""
    star = False
    for m in _PRINTF_WIDTH.finditer(fmt):
        for g in m.groups():
            if g == "*":
                star = True
            elif g:
                budget.check_size(int(g), "a % format width")
    if star:
        for a in args if isinstance(args, tuple) else (args,):
            if isinstance(a, int):
                budget.check_size(abs(a), "a % format width")


def _check_format_string(budget: Budget, fmt: str, args, kwargs) -> None:
    """str.format: no number in the format string or int argument (a nested width) beyond the bound."""
    for digits in re.findall(r"\d+", fmt):
        if len(digits) > 12:
            budget.check_size(budget.limits.chars + 1, "a format width")
        budget.check_size(int(digits), "a format width")
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool):
            budget.check_size(abs(a), "a format argument")


def _joined_size(budget: Budget, sep: str, items) -> int:
    items = list(items)
    budget.check_size(len(items), "a join")
    return len(sep) * max(len(items) - 1, 0) + sum(len(x) if isinstance(x, str) else budget.check_tree(x)
                                                   for x in items)


def _replaced_size(s: str, old: str, new: str, count=-1) -> int:
    hits = len(s) + 1 if not old else s.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * (len(new) - len(old))


def _check_str_method(budget: Budget, s: str, name: str, args, kwargs) -> None:
    """The str methods whose result can be far longer than the string: checked before they run."""
    first = args[0] if args else None
    if name in ("center", "ljust", "rjust", "zfill") and isinstance(first, int):
        budget.check_size(first, f"str.{name}")
    elif name == "expandtabs":
        tab = first if isinstance(first, int) else kwargs.get("tabsize", 8)
        budget.check_size(len(s) + s.count("\t") * max(int(tab), 0), "str.expandtabs")
    elif name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        budget.check_size(_replaced_size(s, args[0], args[1], args[2] if len(args) > 2 else -1), "str.replace")
    elif name == "join" and args:
        budget.check_size(_joined_size(budget, s, args[0]), "str.join")


def _arg(args, kwargs, i: int, name: str, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _check_filter(budget: Budget, name: str, value, args, kwargs) -> None:
    """The filters whose result can be far larger than their input: checked before they run (args without the
    environment/context jinja passes first)."""
    if name == "center":
        width = _arg(args, kwargs, 0, "width", 80)
        if isinstance(width, int):
            budget.check_size(width, "center")
    elif name == "indent" and isinstance(value, str):
        width = _arg(args, kwargs, 0, "width", 4)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        budget.check_size(len(value) + (value.count("\n") + 1) * pad, "indent")
    elif name == "format" and isinstance(value, str):
        _check_printf(budget, value, tuple(args) or kwargs)
    elif name == "join":
        sep = _arg(args, kwargs, 0, "d", "")
        if isinstance(sep, str) and not _arg(args, kwargs, 1, "attribute"):
            budget.check_size(_joined_size(budget, sep, value), "join")
    elif name == "replace" and isinstance(value, str):
        old, new = _arg(args, kwargs, 0, "old"), _arg(args, kwargs, 1, "new")
        if isinstance(old, str) and isinstance(new, str):
            count = _arg(args, kwargs, 2, "count")
            budget.check_size(_replaced_size(value, old, new, -1 if count is None else count), "replace")
    elif name == "wordwrap" and isinstance(value, str):
        width = _arg(args, kwargs, 0, "width", 79)
        wrap = _arg(args, kwargs, 2, "wrapstring") or "\n"
        lines = value.count("\n") + 1 + len(value) // max(width if isinstance(width, int) else 1, 1)
        budget.check_size(len(value) + lines * len(str(wrap)), "wordwrap")
    elif name == "sum":
        budget.check_tree(value)
        items = list(value) if not isinstance(value, (str, dict)) else []
        budget.check_size(sum(len(x) for x in items if isinstance(x, (list, tuple, str))), "sum")
    elif name in ("tojson", "string", "pprint", "list"):
        indent = _arg(args, kwargs, 1, "indent") if name == "tojson" else None
        n = budget.check_tree(value)
        if isinstance(indent, int):
            budget.check_size(n * max(indent, 0), "tojson's indentation")


class _NotFolded(Exception):
    pass


_SIZED = (str, list, tuple, dict, set, frozenset)
_PLAIN_TYPES = frozenset({str, dict, list, tuple, int, float, bool, type(None)})
_DICT_ATTRIBUTES = frozenset(dir(dict))
_JINJA_SCOPES = frozenset({"_loop_vars", "_block_vars"})
"""What jinja2 adds to every call inside a loop or block: the variables the template already holds, taken out
before the callee is called (only a pass_context callee sees them, as its context): not measured at each call."""


def _bounded_filter(budget: Budget, name: str, func):
    """func (a jinja2 filter) with its pre-check, the time check and the result check. jinja passes the
    environment/context first to the filters marked so (their marker is copied by functools.wraps)."""
    from jinja2.utils import _PassArg

    skip = 1 if _PassArg.from_obj(func) is not None else 0

    @functools.wraps(func)
    def bounded(*args, **kwargs):
        if not budget.active:  # jinja2 folding a constant while compiling: leave it to the (bounded) rendering
            raise _NotFolded(name)
        budget.check_time()
        if name in ("join", "sum") and len(args) > skip and not isinstance(args[skip], _SIZED):
            args = (*args[:skip], list(args[skip]), *args[skip + 1:])  # a generator: measured, then joined
        _check_filter(budget, name, args[skip] if len(args) > skip else None, args[skip + 1:], kwargs)
        result = func(*args, **kwargs)
        budget.check_result(result)
        return result

    return bounded


def compile_template(source: str, limits: TemplateLimits):
    """(the template compiled in the bounded sandbox, its Budget). ValueError when it does not compile."""
    import jinja2
    import jinja2.compiler
    import jinja2.ext
    import jinja2.nodes
    import jinja2.runtime
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if tuple(int(x) for x in jinja2.__version__.split(".")[:3] if x.isdigit()) < MIN_JINJA:
        raise ValueError(f"jinja2 {jinja2.__version__} is too old for untrusted chat templates: pip install "
                         f"'jinja2>={'.'.join(map(str, MIN_JINJA))}'")
    budget = Budget(limits)

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: transformers tracks assistant text with it; the body here."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        if len(format) > 1000 or re.search(r"\d{4,}", format):  # glibc pads to any width given
            raise Exceeded("a strftime_now format longer than 1000 characters or with a width of 1000 or more")
        return datetime.now().strftime(format)

    class TemplateDict:
        """`dict(...)` without attribute access to the type (transformers')."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """A namespace that refuses underscore names, as transformers' does (no way to CPython's internals), and
        values beyond the bound (the only place a template keeps a value from one loop iteration to the next)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            budget.check_tree(attrs)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            budget.check_tree(value)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot store underscore-prefixed attributes "
                                                      f"on a namespace, got {name!r}")

    class BoundedCodeGenerator(jinja2.compiler.CodeGenerator):
        """`a ~ b` through the environment's bounded join (jinja2 writes a plain str join)."""

        def visit_Concat(self, node, frame):
            self.write("environment.join_bounded((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        # `+` is not intercepted: its result is at most its two bounded operands, and it is kept only through a
        # namespace, a call or the output, which are checked.
        intercepted_binops = frozenset({"*", "**", "%"})
        code_generator_class = BoundedCodeGenerator
        safe_attributes: dict[tuple[type, str], bool] = {}

        def getattr(self, obj, attribute):
            """`message.role` on a plain dict (what every template does for every message) without the failed
            attribute lookup jinja2 tries first: a dict instance has no attribute outside dir(dict), so the item
            (or undefined) is what jinja2 returns too."""
            if type(obj) is dict and attribute not in _DICT_ATTRIBUTES and isinstance(attribute, str):
                try:
                    return obj[attribute]
                except KeyError:
                    return self.undefined(obj=obj, name=attribute)
            return super().getattr(obj, attribute)

        def is_safe_attribute(self, obj, attr, value):
            """jinja2's answer, remembered for the builtin value types: it depends on the type and the name only
            (a leading underscore, the internal attributes of a type, the methods that modify a list or a dict)."""
            kind = type(obj)
            if kind not in plain_types or not isinstance(attr, str):
                return super().is_safe_attribute(obj, attr, value)
            known = self.safe_attributes.get((kind, attr))
            if known is None:
                known = super().is_safe_attribute(obj, attr, value)
                if len(self.safe_attributes) < 4096:
                    self.safe_attributes[(kind, attr)] = known
            return known

        def call_binop(self, context, operator, left, right):
            budget.check_time()
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                        budget.check_size(len(seq) * n, "a repetition")
                if isinstance(left, int) and isinstance(right, int):
                    budget.check_size((left.bit_length() + right.bit_length()) // 3, "a number's digits")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                budget.check_size(left.bit_length() * max(right, 0) // 3, "a number's digits")
            elif operator == "%" and isinstance(left, str):
                _check_printf(budget, left, right)
            result = super().call_binop(context, operator, left, right)
            budget.check_result(result)
            return result

        def call(__self, __context, __obj, *args, **kwargs):
            budget.check_time()
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, str) and getattr(__obj, "__name__", "") == "join" and args \
                    and not isinstance(args[0], _SIZED):
                args = (list(args[0]), *args[1:])  # a generator: measured, then joined
            if isinstance(owner, str):
                _check_str_method(budget, owner, getattr(__obj, "__name__", ""), args, kwargs)
            for a in args:
                budget.check_tree(a)
            for name, a in kwargs.items():
                if name not in _JINJA_SCOPES:
                    budget.check_tree(a)
            result = ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)
            budget.check_result(result)
            return result

        def wrap_str_format(self, value):
            """str.format / format_map (jinja2 wraps them at attribute access): widths checked first."""
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt = value.__self__

            def checked(*args, **kwargs):
                mapping = args[0] if value.__name__ == "format_map" and args and isinstance(args[0], dict) else {}
                _check_format_string(budget, fmt, args, {**kwargs, **mapping})
                return wrapped(*args, **kwargs)

            return checked

        def concat(self, parts):
            """Every buffer and the output: joined while counting, so that the bound stops it on the way."""
            out: list[str] = []
            n = 0
            for p in parts:
                n += len(p)
                if n > budget.limits.chars:
                    budget.check_size(n, "the rendering")
                if len(out) & 1023 == 1023:
                    budget.check_time()
                out.append(p)
            return "".join(out)

        def join_bounded(self, parts):
            return self.concat(map(printable, parts))

    def printable(value) -> str:
        if not isinstance(value, str):
            budget.check_tree(value)  # before str() walks it
            value = str(value)
        return value

    def finalize(value):  # every {{ value }}: a container is printed only when its tree is within the bound
        budget.check_tree(value)
        return value

    plain_types = _PLAIN_TYPES | {jinja2.runtime.LoopContext, TemplateNamespace}
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols],
                         finalize=finalize)
    env.filters["tojson"] = tojson
    env.filters = {name: _bounded_filter(budget, name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    try:
        return env.from_string(source), budget
    except Exceeded as e:
        raise ValueError(f"the chat template does not compile: {e}") from None
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"the chat template does not compile: {e} (line {e.lineno})") from None
