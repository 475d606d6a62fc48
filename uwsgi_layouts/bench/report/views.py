"""One section spec, one writer per format (hyperfine's exporters): a section says WHAT it shows,
built once from the ``Summary``; ``TextView`` (report.txt, the terminal) and ``MarkdownView``
(report.md) each say only HOW a block is written. A section is never built twice for two formats,
so they cannot say different things.

Blocks: ``Lead`` (the section's one-sentence answer, opening it), ``Conclusion`` (the answer after
the figures it is read from), ``Note`` (a paragraph), ``Items`` (a list; ``label`` names it:
Markdown puts it above, text in front of every item), ``Sentences`` (one sentence a line),
``Grid`` (a table), ``Gap`` (a blank line the text form needs; Markdown's blocks are spaced).
"""

from __future__ import annotations

from dataclasses import dataclass

from uwsgi_layouts.bench.report.text import md_table, table, wrap


def check_text(field: str, value) -> None:
    """A spec's field that holds one string (a list or None there is a spec built wrong)."""
    if not isinstance(value, str):
        raise ValueError(f"{field}: a string, got {type(value).__name__}")


def check_lines(field: str, value) -> None:
    """A spec's field that holds strings, as a tuple: a string there would be written letter by letter."""
    if not isinstance(value, tuple) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{field}: a tuple of strings, got {value!r:.80}")


def check_table(field: str, headers, rows, align: str, columns: int) -> None:
    """A table of a spec: string headers, rows of strings each as long as the headers, and an
    alignment (``<`` or ``>``) for ``columns`` of them (the ones after it align left)."""
    check_lines(f"{field}.headers", headers)
    if not isinstance(rows, tuple) or not all(isinstance(r, tuple) for r in rows):
        raise ValueError(f"{field}.rows: a tuple of rows (tuples), got {type(rows).__name__}")
    for i, row in enumerate(rows):
        check_lines(f"{field}.rows[{i}]", row)
        if len(row) != len(headers):
            raise ValueError(f"{field}.rows[{i}]: {len(row)} cells, the headers name {len(headers)}")
    check_text(f"{field}.align", align)
    if len(align) != columns or set(align) - {"<", ">"}:
        raise ValueError(f"{field}.align: {columns} of '<' or '>' for {len(headers)} headers, got {align!r}")


@dataclass(frozen=True)
class Lead:
    text: str
    after: str = ""  # what follows the answer, not in bold: `` (95% confidence ...)``


@dataclass(frozen=True)
class Conclusion:
    text: str


@dataclass(frozen=True)
class Note:
    text: str


@dataclass(frozen=True)
class Gap:
    pass


@dataclass(frozen=True)
class Items:
    items: tuple[str, ...]
    label: str = ""  # "caution": text writes "caution: X" a line; Markdown a "Cautions:" list


@dataclass(frozen=True)
class Sentences:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Grid:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    align: str

    def __post_init__(self):
        if any(len(r) != len(self.headers) for r in self.rows):
            raise ValueError(f"rows: every row needs {len(self.headers)} cells")


Block = Lead | Conclusion | Note | Gap | Items | Sentences | Grid


@dataclass(frozen=True)
class Section:
    """``title``: the Markdown heading, and the text form's (``Verdict: ...`` when the section
    opens with a ``Lead``, else a ``title:`` line of its own, or ``text_title:`` when given)."""

    title: str
    blocks: tuple[Block, ...]
    text_title: str = ""


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


class TextView:
    """report.txt and the terminal: wrapped at about 100 columns, two-space indents."""

    def lines(self, section: Section) -> list[str]:
        blocks = section.blocks
        if blocks and isinstance(blocks[0], Lead):
            out = wrap(f"{section.title}: {blocks[0].text}{blocks[0].after}")
            blocks = blocks[1:]
        else:
            out = ["", f"{section.text_title or section.title.lower()}:"]
        for b in blocks:
            if isinstance(b, (Note, Conclusion)):
                out += wrap(b.text, indent="  ", subsequent="  ")
            elif isinstance(b, Gap):
                out.append("")
            elif isinstance(b, Items):
                for x in b.items:
                    out += (wrap(f"{b.label}: {x}", indent="  ", subsequent="    ") if b.label
                            else wrap(x, indent="  - ", subsequent="    "))
            elif isinstance(b, Sentences):
                for x in b.items:
                    out += wrap(x, indent="  ", subsequent="    ")
            else:
                out += ["  " + x for x in table(list(b.headers), [list(r) for r in b.rows], b.align)]
        return out


class MarkdownView:
    """report.md: a ``##`` heading, the lead in bold, lists and tables with a blank line after."""

    def lines(self, section: Section) -> list[str]:
        out = [f"## {section.title}", ""]
        for b in section.blocks:
            if isinstance(b, Lead):
                out += [f"**{_cap(b.text)}**{b.after}", ""]
            elif isinstance(b, Conclusion):
                out += [f"**{b.text}**", ""]
            elif isinstance(b, Note):
                out += [b.text, ""]
            elif isinstance(b, Gap):
                continue
            elif isinstance(b, Items):
                out += ([f"{_cap(b.label)}s:", ""] if b.label else []) + [f"- {x}" for x in b.items] + [""]
            elif isinstance(b, Sentences):
                out += [f"{_cap(x)}." for x in b.items] + [""]
            else:
                out += md_table(list(b.headers), [list(r) for r in b.rows], b.align) + [""]
        return out


def written(view: TextView | MarkdownView, section: Section | None) -> list[str]:
    """``section`` in ``view``'s format ([] for a section the run has not)."""
    return [] if section is None else view.lines(section)
