"""``capgate diff --html FILE``: the role x tool grids as one self-contained page.

The page (:func:`render`) draws the :class:`~capgate.cli.commands.diff.grid.Grid` of a
:class:`~capgate.cli.commands.diff.report.Report`: the revisions, the matrix and the
counts the text report gives, a legend, the overview over the whole matrix and, per
scenario group with a flip, each role's answer for each tool that flips, base beside
head. A widened cell (more access at head) and a narrowed one (less) are marked by
colour and by a symbol (▲, ▼; ▲▼ when one call widens and another narrows, ≠ for
other reasons only), so the page reads without colour and in print. The marks are
inline SVG (printed as drawn, unlike backgrounds); there is no script, no external
asset and no request.

Every cell carries ``data-role``, ``data-tool`` and ``data-change`` (one of
:data:`~capgate.cli.commands.diff.grid.CHANGES`), and each group's table its
``data-task-type``, ``data-environment``, ``data-budget-class`` and
``data-connections``, for tools and tests to read.

Everything from the repository (tool and role names, reason codes, revisions, the
matrix's values) is text, never markup: the page is built with :func:`_tag`, which
escapes every text child and attribute value with :func:`html.escape` (after
:func:`~capgate.cli.commands.common.safe`, so a control or bidi character shows as an
escape), and only this module's own fragments (:class:`_Markup`) pass unescaped.
The standard library, because Jinja2 is the ``mcp`` extra's and this command is core.

A module of its own so that the grid's data and its drawing change apart.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping
from typing import Final

from capgate.cli.commands.common import safe
from capgate.cli.commands.diff.compare import KINDS, WIDENING
from capgate.cli.commands.diff.grid import (
    MIXED,
    NARROWED,
    REASONS_CHANGED,
    SAME,
    WIDENED,
    Cell,
    Grid,
    Group,
    Look,
    Total,
)
from capgate.cli.commands.diff.report import Report, change_text

__all__ = ["render"]

#: The symbol of each change, beside its colour.
SYMBOLS: Final = {WIDENED: "▲", NARROWED: "▼", MIXED: "▲▼", REASONS_CHANGED: "≠", SAME: ""}
#: Tools named at most in a note of what is left out.
_MOST_NAMED: Final = 50
_SAYS: Final = {
    WIDENED: "widened: more access at head",
    NARROWED: "narrowed: less access at head",
    MIXED: "both: one call widened, another narrowed",
    REASONS_CHANGED: "hidden at both, for other reasons",
    SAME: "the same at both",
}


class _Markup(str):
    """HTML this module made (its tags and escaped text): passed through unescaped."""

    __slots__ = ()


def _text(value: object) -> _Markup:
    # Line by line: safe() would show a newline as an escape, and a title's lines are
    # this module's (a newline in HTML text is only white space).
    lines = str(value).split("\n")
    return _Markup(html.escape("\n".join(safe(line) for line in lines), quote=True))


def _tag(name: str, attrs: Mapping[str, object] | None = None, *children: object) -> _Markup:
    """``<name attrs>children</name>``: every attribute value and every child that is
    not :class:`_Markup` escaped. ``name`` and the attribute names are this module's."""
    opened = [name]
    for key, value in (attrs or {}).items():
        if value is not None:
            opened.append(f'{key}="{_text(value)}"')
    inner = "".join(c if isinstance(c, _Markup) else _text(c) for c in children)
    return _Markup(f"<{' '.join(opened)}>{inner}</{name}>")


def _join(parts: list[_Markup]) -> _Markup:
    return _Markup("\n".join(parts))


# ------------------------------------------------------------------------ marks

_SHAPES: Final = {
    "visible": '<rect x="{x}" y="2" width="11" height="11" class="m-visible"/>',
    "hidden": '<rect x="{x}" y="2" width="11" height="11" class="m-hidden"/>'
    '<path d="M{x} 2l11 11" class="m-hidden"/>',
    "absent": '<rect x="{x}" y="2" width="11" height="11" class="m-absent"/>',
}


def _mark(base: str, head: str) -> _Markup:
    """A base shape, an arrow and a head shape, as inline SVG."""
    shapes = _SHAPES[base].format(x=1.5) + _SHAPES[head].format(x=24.5)
    arrow = '<path d="M15 7.5h6m-2-2.5 2.5 2.5-2.5 2.5" class="m-arrow"/>'
    label = f"base {base}, head {head}"
    return _Markup(
        f'<svg class="mark" width="37" height="15" viewBox="0 0 37 15" role="img" '
        f'aria-label="{_text(label)}"><title>{_text(label)}</title>{shapes}{arrow}</svg>'
    )


def _symbol(change: str) -> _Markup:
    return _tag("span", {"class": "sym", "aria-hidden": "true"}, SYMBOLS[change])


def _look(look: Look) -> str:
    what = look.shown if not look.reasons else f"{look.shown} ({', '.join(look.reasons)})"
    if look.asked:
        what += f", calls allowed {look.allowed}/{look.asked}"
    return what


def _cell(cell: Cell) -> _Markup:
    attrs: dict[str, object] = {
        "data-role": cell.role,
        "data-tool": cell.tool,
        "data-change": cell.change,
        "class": f"cell c-{cell.change}",
    }
    if cell.base is None or cell.head is None:
        attrs |= {"data-evaluated": "no", "title": "not in the sample (--limit)"}
        return _tag("td", attrs, _tag("span", {"class": "none"}, "not sampled"))
    lines = [f"role {cell.role}, tool {cell.tool}: {_SAYS[cell.change]}"]
    lines += [f"base: {_look(cell.base)}", f"head: {_look(cell.head)}"]
    lines += [f"{flip.kind}{'' if flip.call is None else f' ({flip.call})'}" for flip in cell.flips]
    attrs["title"] = "\n".join(lines)
    parts = [_symbol(cell.change), _mark(cell.base.shown, cell.head.shown)]
    if cell.base.asked:
        calls = f"{cell.base.allowed}→{cell.head.allowed}/{cell.base.asked}"
        parts.append(_tag("span", {"class": "calls"}, f"calls {calls}"))
    return _tag("td", attrs, *parts)


def _total(total: Total) -> _Markup:
    counted = Counter(flip.kind for flip in total.flips)
    lines = [f"role {total.role}, tool {total.tool}: {_SAYS[total.change]}"]
    lines.append(
        f"visible in {total.visible[0]} (base) and {total.visible[1]} (head) "
        f"of {total.scenarios} scenarios"
    )
    if total.asked:
        lines.append(
            f"calls allowed: {total.allowed[0]} (base) and {total.allowed[1]} (head) "
            f"of {total.asked}"
        )
    lines += [f"{kind}: {counted[kind]}" for kind in KINDS if counted[kind]]
    attrs = {
        "data-role": total.role,
        "data-tool": total.tool,
        "data-change": total.change,
        "class": f"cell c-{total.change}",
        "title": "\n".join(lines),
    }
    parts = [
        _symbol(total.change),
        _tag(
            "span",
            {"class": "shown"},
            f"shown {total.visible[0]}→{total.visible[1]}/{total.scenarios}",
        ),
    ]
    if total.asked:
        calls = f"calls {total.allowed[0]}→{total.allowed[1]}/{total.asked}"
        parts.append(_tag("span", {"class": "calls"}, calls))
    return _tag("td", attrs, *parts)


def _table(grid: Grid, rows: list[_Markup], caption: str, attrs: Mapping[str, object]) -> _Markup:
    heads = [_tag("th", {"scope": "col", "class": "corner"}, "role \\ tool")]
    heads += [
        _tag("th", {"scope": "col", "class": "tool"}, _tag("span", {}, t)) for t in grid.tools
    ]
    return _tag(
        "table",
        attrs,
        _tag("caption", {}, caption),
        _tag("thead", {}, _tag("tr", {}, *heads)),
        _tag("tbody", {}, _join(rows)),
    )


def _row(role: str, cells: list[_Markup]) -> _Markup:
    return _tag("tr", {}, _tag("th", {"scope": "row", "class": "role"}, role), *cells)


def _overview(grid: Grid) -> _Markup:
    rows = [
        _row(role, [_total(t) for t in totals])
        for role, totals in zip(grid.roles, grid.overview, strict=True)
    ]
    caption = (
        "Each role over all its scenarios: in how many each side shows the tool "
        "(shown base→head/scenarios) and, of the calls asked, how many each allows"
    )
    table = _table(grid, rows, caption, {"class": "grid overview", "data-grid": "overview"})
    return _tag("section", {"id": "overview"}, _tag("h2", {}, "Over the whole matrix"), table)


def _group(grid: Grid, group: Group, show: int) -> _Markup:
    rows = [_row(row[0].role, [_cell(c) for c in row]) for row in group.rows]
    title = (
        f"task {group.task_type}, env {group.environment}, budget {group.budget_class}, "
        f"connections {group.connections}"
    )
    attrs = {
        "class": "grid group",
        "data-grid": "group",
        "data-task-type": group.task_type,
        "data-environment": group.environment,
        "data-budget-class": group.budget_class,
        "data-connections": group.connections,
    }
    caption = f"{group.flips} flipped decision(s); each cell base → head"
    listed: list[_Markup] = []
    for row in group.rows:
        for cell in row:
            for flip in cell.flips[:show]:
                call = "" if flip.call is None else f", call {flip.call}"
                what = f"role {cell.role}, tool {cell.tool}{call}: {change_text(flip)}"
                listed.append(
                    _tag(
                        "li", {}, _tag("span", {"class": f"kind c-{cell.change}"}, flip.kind), what
                    )
                )
            if len(cell.flips) > show:
                more = f"role {cell.role}, tool {cell.tool}: and {len(cell.flips) - show} more"
                listed.append(_tag("li", {}, f"{more} (--show N)"))
    details = _tag(
        "details",
        {},
        _tag("summary", {}, "The flipped decisions, with their reasons"),
        _tag("ul", {}, _join(listed)),
    )
    return _tag(
        "section",
        {"class": "group"},
        _tag("h3", {}, title),
        _table(grid, rows, caption, attrs),
        details,
    )


def _legend() -> _Markup:
    marks = [
        ("visible", "visible (compose shows the tool)"),
        ("hidden", "hidden (compose hides it)"),
        ("absent", "not in that side's catalogue"),
    ]
    items = [_tag("li", {}, _mark(shape, shape), _Markup(" "), what) for shape, what in marks]
    items.append(_tag("li", {}, "Each cell: base's mark → head's mark."))
    items.append(
        _tag(
            "li",
            {},
            "calls a→b/n: of the n calls asked (all connections active), "
            "a allowed at base, b at head.",
        )
    )
    for change in (WIDENED, NARROWED, MIXED, REASONS_CHANGED):
        items.append(
            _tag(
                "li",
                {"class": f"cell c-{change} key", "data-legend": change},
                _symbol(change),
                _Markup(" "),
                _SAYS[change],
            )
        )
    return _tag("section", {"id": "legend"}, _tag("h2", {}, "Legend"), _tag("ul", {}, _join(items)))


def _counts(report: Report) -> _Markup:
    counted = Counter(flip.kind for flip in report.flips)
    rows = [
        _tag(
            "tr",
            {"class": "widening" if kind in WIDENING else None},
            _tag("th", {"scope": "row"}, kind),
            _tag("td", {"data-kind": kind}, str(counted[kind])),
        )
        for kind in KINDS
    ]
    return _tag("table", {"class": "counts"}, _tag("caption", {}, "Flips by kind"), _join(rows))


def _notes(grid: Grid) -> list[_Markup]:
    notes = [
        f"{grid.groups_flipped} of {grid.groups_evaluated} scenario groups (every "
        "dimension but the role) have a flip"
    ]
    if len(grid.groups) < grid.groups_flipped:
        notes.append(
            f"{len(grid.groups)} of them are drawn (widening ones first); --json lists every flip"
        )
    if grid.tools_left_out:
        notes.append(
            f"{len(grid.tools_left_out)} more tool(s) flip but are not columns (the "
            f"widening ones are columns first): {_names(grid.tools_left_out)}"
        )
    if grid.tools_unchanged:
        notes.append(
            f"{len(grid.tools_unchanged)} tool(s) flip nowhere and are left out: "
            f"{_names(grid.tools_unchanged)}"
        )
    return [_tag("p", {"class": "note"}, note) for note in notes]


def _names(names: tuple[str, ...]) -> str:
    """At most :data:`_MOST_NAMED` of ``names``, and how many more."""
    shown = ", ".join(names[:_MOST_NAMED])
    more = len(names) - _MOST_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def render(report: Report) -> str:
    """The whole page for ``report``."""
    grid = Grid.of(report)
    base, head = report.base, report.head
    facts = _tag(
        "dl",
        {"class": "facts"},
        _tag("dt", {}, "Base"),
        _tag("dd", {"data-revision": "base"}, base.label),
        _tag("dt", {}, "Head"),
        _tag("dd", {"data-revision": "head"}, head.label),
        _tag("dt", {}, "Matrix"),
        _tag("dd", {}, report.matrix.describe()),
        _tag("dt", {}, "Reasons"),
        _tag("dd", {}, f"base from {base.reasons_from}, head from {head.reasons_from}"),
        _tag("dt", {}, "Calls"),
        _tag("dd", {}, report.describe_calls()),
    )
    header = [_tag("h1", {}, "capgate diff"), facts]
    header.append(_tag("p", {"class": "summary", "id": "summary"}, report.summary()))
    if report.widened:
        header.append(
            _tag(
                "p",
                {"class": "warning c-widened", "id": "widened"},
                _symbol(WIDENED),
                f" Widens: {report.widened} decision(s) hidden or denied at base are visible "
                "or allowed at head",
            )
        )
    header.append(_counts(report))
    body = [_tag("header", {}, _join(header))]
    if not report.flips:
        body.append(
            _tag(
                "p",
                {"class": "nothing", "id": "nothing-changed"},
                f"Nothing changed: each of the {len(report.scenarios)} scenarios and "
                f"{report.calls[0]} calls evaluated gets the same decision at base and head.",
            )
        )
    else:
        body += [_legend(), _overview(grid)]
        groups = [_group(grid, group, report.show) for group in grid.groups]
        body.append(
            _tag(
                "section",
                {"id": "groups"},
                _tag("h2", {}, "Per scenario group"),
                _join(_notes(grid)),
                _join(groups),
            )
        )
    title = f"capgate diff: {base.label} → {head.label}"
    head_html = _join(
        [
            _Markup('<meta charset="utf-8">'),
            _Markup('<meta name="viewport" content="width=device-width, initial-scale=1">'),
            _tag("title", {}, title),
            _Markup(f"<style>{_STYLE}</style>"),
        ]
    )
    document = _tag(
        "html", {"lang": "en"}, _tag("head", {}, head_html), _tag("body", {}, _join(body))
    )
    return f"<!DOCTYPE html>\n{document}\n"


# Okabe-Ito colours (told apart with colour blindness): vermilion for widened,
# blue for narrowed, reddish purple for both; each with its symbol too.
_STYLE: Final = """
:root { color-scheme: light; --widened: #d55e00; --narrowed: #0072b2; --mixed: #cc79a7;
  --reasons: #6b6b6b; --ink: #1b1b1b; }
* { print-color-adjust: exact; -webkit-print-color-adjust: exact; }
body { font: 14px/1.4 system-ui, sans-serif; color: var(--ink); margin: 1.5rem; }
h1 { margin: 0 0 .5rem; } h2 { margin-top: 2rem; } h3 { margin: 1.5rem 0 .25rem; font-size: 1rem; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: .1rem 1rem; }
dl.facts dt { font-weight: 600; } dl.facts dd { margin: 0; font-family: ui-monospace, monospace; }
.summary { font-weight: 600; font-size: 1.05rem; }
.warning { padding: .4rem .6rem; border-left: 4px solid var(--widened); font-weight: 600; }
table.counts { border-collapse: collapse; margin: .5rem 0; }
table.counts th, table.counts td { padding: .1rem .6rem; text-align: left;
  border-bottom: 1px solid #ddd; }
table.counts td { text-align: right; font-variant-numeric: tabular-nums; }
caption { text-align: left; color: #444; padding: .2rem 0; caption-side: top; }
table.grid { border-collapse: collapse; margin: .25rem 0 .5rem; }
table.grid th, table.grid td { border: 1px solid #bbb; padding: .2rem .35rem; }
th.tool { vertical-align: bottom; font-weight: 500; font-family: ui-monospace, monospace; }
th.tool span { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; }
th.role { text-align: left; font-family: ui-monospace, monospace; font-weight: 500; }
td.cell { white-space: nowrap; text-align: center; min-width: 3.2rem; }
td.cell .calls, td.cell .shown { display: block; font-size: 11px;
  font-variant-numeric: tabular-nums; }
.sym { display: inline-block; min-width: 1.1em; font-weight: 700; }
.c-widened { background: #fbe1cf; outline: 2px solid var(--widened); outline-offset: -2px; }
.c-widened .sym, span.kind.c-widened { color: var(--widened); }
.c-narrowed { background: #d9eaf6; outline: 2px dashed var(--narrowed); outline-offset: -2px; }
.c-narrowed .sym, span.kind.c-narrowed { color: var(--narrowed); }
.c-mixed { background: #f5e1ec; outline: 2px dotted var(--mixed); outline-offset: -2px; }
.c-mixed .sym, span.kind.c-mixed { color: #8a3f6a; }
.c-reasons .sym, span.kind.c-reasons { color: var(--reasons); }
span.kind { font-weight: 600; margin-right: .4rem; background: none; outline: none; }
.none { color: #777; font-size: 11px; }
svg.mark { vertical-align: middle; }
.m-visible { fill: var(--ink); stroke: var(--ink); }
.m-hidden { fill: #fff; stroke: var(--ink); stroke-width: 1.2; }
.m-absent { fill: none; stroke: var(--ink); stroke-width: 1.2; stroke-dasharray: 2 2; }
.m-arrow { fill: none; stroke: #555; stroke-width: 1.3; }
#legend ul { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: .4rem 1.2rem; }
#legend li.key { padding: .15rem .5rem; }
.nothing { font-size: 1.1rem; padding: .6rem .8rem; border-left: 4px solid #009e73; }
.note { color: #333; margin: .2rem 0; }
@media print { body { margin: 0; } section.group { break-inside: avoid; } }
"""
