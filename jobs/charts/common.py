"""What every figure shares: the colour-blind-safe palette, the font, and escaping of outside text.

Plotly interprets a small HTML subset (<a href>, <b>, <br>) in labels and decodes entities back for
display, so names from users or traces (hosts, frames, kernels) are escaped before they go into a figure.
"""

from __future__ import annotations

import html

# Okabe-Ito, the colour-blind-safe palette of app.css. Lines use only the members with >= 3:1 contrast on
# white (blue, vermillion, green, black, purple) and differ in dash style too: colour is never the only cue.
BLACK, ORANGE, SKY, GREEN = "#000000", "#E69F00", "#56B4E9", "#009E73"
YELLOW, BLUE, VERMILLION, PURPLE = "#F0E442", "#0072B2", "#D55E00", "#CC79A7"
GREY = "#5f6b77"
FINDING_COLOURS = (VERMILLION, BLUE, GREEN, PURPLE, ORANGE, SKY, BLACK, YELLOW)

FONT = {"family": 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif', "size": 12, "color": "#1b1f24"}


def escape(text: object) -> str:
    """Text from users or traces made inert for Plotly's HTML-like labels (entities display literally)."""
    return html.escape(str(text), quote=False)
