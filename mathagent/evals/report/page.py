"""The page around every report: inline style, inline checks, table and metadata helpers.

Nothing is fetched from elsewhere (users may have no internet): style, highlighting colours
and the script live in the page. The script runs the page's own checks on load (every problem
holds the samples it counts, no answer reads "None", every executed code block has its output
box) and publishes them as ``window.reportChecks`` and ``<html data-checks>``; the browser test
reads them, a reader sees them in the footer.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from pygments.formatters import HtmlFormatter

STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}
img{max-width:100%;margin:0.5em 0}.meta{color:#666}
details.problem{border:1px solid #ddd;border-radius:4px;margin:4px 0}
details.problem>summary{display:grid;grid-template-columns:var(--cols);gap:8px;padding:4px 8px;
cursor:pointer;align-items:baseline}details.problem[open]>summary{background:#f6f6f6}
.body{padding:4px 12px 12px}.statement{white-space:pre-wrap;margin:6px 0 10px}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:12px}.cols>div{min-width:0}
details.sample{border-left:3px solid #bbb;margin:8px 0;padding-left:8px}
details.sample.ok{border-left-color:#4a4}details.sample.bad{border-left-color:#c44}
details.sample>summary{cursor:pointer;color:#444}
.answer{font-family:ui-monospace,monospace;margin-right:6px}.answer.ok{color:#262}
.answer.bad{color:#a22}.noans{color:#888;font-style:italic}
.text{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:13px;margin:4px 0}
pre.code{background:#f8f8f8;border:1px solid #e4e4e4;padding:6px;overflow-x:auto;margin:4px 0;
font-size:13px}.tag{color:#999}
.out{border:1px solid #4a4;border-radius:4px;margin:4px 0 8px;font-size:13px}
.out.bad{border-color:#c44}.out>.title{font-size:12px;color:#4a4;padding:1px 6px}
.out.bad>.title{color:#c44}.out>pre{margin:0;padding:4px 8px;white-space:pre-wrap}
.win{color:#262;font-weight:600}.loss{color:#a22;font-weight:600}.tie{color:#666}
.head{display:grid;grid-template-columns:var(--cols);gap:8px;padding:2px 8px 2px 24px;
font-weight:600;color:#555}.diff{font-size:1.1em}button{margin-right:6px}#checks{color:#666;font-size:12px}
"""

SCRIPT = """
function setAll(open){document.querySelectorAll('details').forEach(d=>{d.open=open;});}
(function(){
  const failures=[];
  const lists=document.querySelectorAll('.samples');
  lists.forEach(list=>{
    const want=Number(list.dataset.count);
    const got=list.querySelectorAll(':scope>details.sample').length;
    if(want!==got){failures.push(list.dataset.where+': '+got+' samples shown, '+want+' counted');}
  });
  document.querySelectorAll('.answer').forEach(a=>{
    if(/^(None|null|undefined|)$/.test(a.textContent.trim())){
      failures.push('an answer reads "'+a.textContent+'"');}
  });
  document.querySelectorAll('pre.code[data-call]').forEach(c=>{
    const box=c.parentElement.querySelector('.out[data-call="'+c.dataset.call+'"]');
    if(!box){failures.push('code block '+c.dataset.call+' has no output box');}
  });
  const problems=document.querySelectorAll('details.problem').length;
  const declared=document.body.dataset.problems;
  if(declared!==undefined&&Number(declared)!==problems){
    failures.push(problems+' problems shown, '+declared+' in the data');}
  const checks={ok:failures.length===0,failures:failures,problems:problems,
    samples:document.querySelectorAll('details.sample').length,
    code:document.querySelectorAll('pre.code').length,
    outputs:document.querySelectorAll('.out').length};
  window.reportChecks=checks;
  document.documentElement.dataset.checks=checks.ok?'pass':'fail';
  const note=document.getElementById('checks');
  if(note){note.textContent='page checks: '+(checks.ok?'pass':'FAIL: '+failures.join('; '));}
  if(!checks.ok){console.error('report checks failed: '+failures.join('; '));}
})();
"""

HIGHLIGHT_CSS = HtmlFormatter(style="default").get_style_defs(".hl")


def page(title: str, body: str, problems: int | None = None) -> str:
    """The whole document; ``problems`` is how many problem rows the data holds (checked)."""
    count = "" if problems is None else f" data-problems='{problems}'"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}{HIGHLIGHT_CSS}</style></head><body{count}>"
        f"<h1>{html.escape(title)}</h1>{body}<p id=checks></p>"
        f"<script>{SCRIPT}</script></body></html>\n"
    )


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    """An HTML table; floats with two decimals, the first ``left`` columns left-aligned."""

    def cell(tag: str, i: int, value: Any) -> str:
        text = f"{value:.2f}" if isinstance(value, float) else html.escape(str(value))
        return f"<{tag}{' class=l' if i < left else ''}>{text}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def meta(items: Mapping[str, Any], label: str = "") -> str:
    """A run's metadata line (dataset, model, tools...)."""
    text = ", ".join(f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in items.items())
    return f"<p class=meta>{html.escape(label)}{text}</p>"


def problems_head(cols: str, labels: Sequence[str]) -> str:
    """Column labels above the problem rows (the rows' own grid)."""
    cells = "".join(f"<span>{html.escape(label)}</span>" for label in labels)
    return f"<div class=head style='{cols}'>{cells}</div>"


def expand_buttons() -> str:
    return (
        "<p><button type=button onclick='setAll(true)'>expand all</button>"
        "<button type=button onclick='setAll(false)'>collapse all</button></p>"
    )
