#!/usr/bin/env python3
"""Turns a terminal screen captured with its colours (`tmux capture-pane -e -p`) into an SVG:
one monospace text cell per character, with the SGR colours, bold and reverse video.

usage: tmux capture-pane -e -p -t S | scripts/term-svg.py > screen.svg
       rsvg-convert -w 1600 screen.svg -o screen.png
"""
import re
import sys
from html import escape

BG, FG = "#1e1e1e", "#d4d4d4"
BASE = ["#1e1e1e", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5"]
BRIGHT = ["#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff"]
CW, CH = 8.4, 17  # cell width and height in px, for a 14 px monospace font


def color256(n):
    if n < 8:
        return BASE[n]
    if n < 16:
        return BRIGHT[n - 8]
    if n < 232:
        n -= 16
        steps = [0, 95, 135, 175, 215, 255]
        return "#%02x%02x%02x" % (steps[n // 36], steps[(n // 6) % 6], steps[n % 6])
    g = 8 + 10 * (n - 232)
    return "#%02x%02x%02x" % (g, g, g)


def cells(line, state):
    """The line's characters, each with (fg, bg, bold, reverse)."""
    out = []
    for part in re.split(r"(\x1b\[[0-9;]*m)", line):
        m = re.fullmatch(r"\x1b\[([0-9;]*)m", part)
        if not m:
            out.extend((ch, tuple(state.values())) for ch in part)
            continue
        codes = [int(c) if c else 0 for c in m.group(1).split(";")]
        i = 0
        while i < len(codes):
            c = codes[i]
            if c == 0:
                state.update(fg=None, bg=None, bold=False, rev=False)
            elif c == 1:
                state["bold"] = True
            elif c == 22:
                state["bold"] = False
            elif c == 7:
                state["rev"] = True
            elif c == 27:
                state["rev"] = False
            elif 30 <= c <= 37:
                state["fg"] = BASE[c - 30]
            elif 90 <= c <= 97:
                state["fg"] = BRIGHT[c - 90]
            elif c == 39:
                state["fg"] = None
            elif 40 <= c <= 47:
                state["bg"] = BASE[c - 40]
            elif 100 <= c <= 107:
                state["bg"] = BRIGHT[c - 100]
            elif c == 49:
                state["bg"] = None
            elif c in (38, 48) and i + 2 < len(codes) and codes[i + 1] == 5:
                state["fg" if c == 38 else "bg"] = color256(codes[i + 2])
                i += 2
            elif c in (38, 48) and i + 4 < len(codes) and codes[i + 1] == 2:
                state["fg" if c == 38 else "bg"] = "#%02x%02x%02x" % tuple(codes[i + 2 : i + 5])
                i += 4
            i += 1
    return out


def main():
    lines = sys.stdin.read().rstrip("\n").split("\n")
    state = dict(fg=None, bg=None, bold=False, rev=False)
    rows = [cells(l, state) for l in lines]
    width = max((len(r) for r in rows), default=0)
    w, h = width * CW + 16, len(rows) * CH + 16
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}">',
        f'<rect width="100%" height="100%" fill="{BG}"/>',
        '<g font-family="DejaVu Sans Mono, monospace" font-size="14">',
    ]
    for y, row in enumerate(rows):
        for x, (ch, (fg, bg, bold, rev)) in enumerate(row):
            fg, bg = fg or FG, bg
            if rev:
                fg, bg = (bg or BG), fg
            px, py = 8 + x * CW, 8 + y * CH
            if bg:
                svg.append(f'<rect x="{px:.1f}" y="{py}" width="{CW + 0.2:.1f}" height="{CH}" fill="{bg}"/>')
            if ch.strip():
                weight = ' font-weight="bold"' if bold else ""
                svg.append(
                    f'<text x="{px:.1f}" y="{py + 13}" fill="{fg}"{weight}>{escape(ch)}</text>'
                )
    svg.append("</g></svg>")
    print("\n".join(svg))


if __name__ == "__main__":
    main()
